#!/usr/bin/env node
// talkback.js: an example jobcar *HTTP* handler in Node.js that talks back to jobcar during its job
// through the handler API (docs/handler-api.md): progress, log lines, durable steps and a snooze.
// Standard library only (no npm packages).
//
//   PORT=8080 node handlers/node/talkback.js      (PORT=0 picks a free port; either way the first line
//                                                   on stdout is "listening on <port>")
//
// Each request jobcar sends carries, beside the job's metadata, where its attempt's handler API is and
// the token that proves the call comes from this attempt:
//
//   Jobcar-Attempt-Url     http://127.0.0.1:9321/v1/attempts/<job id>
//   Jobcar-Attempt-Token   a secret good for this one attempt while it runs: `Authorization: Bearer <it>`
//
// Three job types, one route each:
//
//   POST /report   {"items": 5, "seconds_per_item": 1}: a long job; logs a line and reports its progress
//                  after each item.
//   POST /steps    {"order": "A-17"}: reserve a seat, then charge for it, each step's result kept with
//                  the job: a retry skips what an earlier attempt finished. Test hook:
//                  {"die_after_first_step": true} fails the first attempt (500) right after the first step.
//   POST /snooze   {"file": "/srv/exports/today.csv", "delay": "30s"}: while the file is missing, come
//                  back later without spending an attempt.
//
// WORK_LOG=<file> appends a line per side effect of /steps ("reserve <order> <attempt>", "charge <order>
// <seat>"): it stands in for what must not happen twice.
//
// Config:
//   handlers:
//     report.build:   {url: "http://127.0.0.1:8080/report"}
//     order.place:    {url: "http://127.0.0.1:8080/steps"}
//     export.publish: {url: "http://127.0.0.1:8080/snooze", max_snoozes: 100}
"use strict";

const http = require("node:http");
const fs = require("node:fs");

const WORK_LOG = process.env.WORK_LOG || "";

// The handler API refused a call: 409 when the job was canceled, this attempt lost its lease (another
// attempt may run the job now) or already answered, 401 for a wrong token. Stop working: this attempt's
// answer will not count.
class Refused extends Error {}

// This attempt's handler API, from the request's headers.
class Attempt {
  constructor(headers) {
    this.url = headers["jobcar-attempt-url"];
    this.token = headers["jobcar-attempt-token"];
    if (!this.url || !this.token) throw new TypeError("no Jobcar-Attempt-Url and -Token headers: not sent by jobcar");
  }

  // One call: resolves to its answer's body (null for a 404 when missingOk).
  call(method, path, body = null, contentType = "application/json", missingOk = false) {
    const headers = { Authorization: `Bearer ${this.token}`, "Content-Type": contentType };
    if (body !== null) headers["Content-Length"] = Buffer.byteLength(body);
    return new Promise((resolve, reject) => {
      const req = http.request(this.url + path, { method, headers }, (res) => {
        const chunks = [];
        res.on("data", (chunk) => chunks.push(chunk));
        res.on("end", () => {
          const answer = Buffer.concat(chunks);
          if (res.statusCode < 300) return resolve(answer);
          if (res.statusCode === 404 && missingOk) return resolve(null);
          const why = `${method} ${path}: HTTP ${res.statusCode} ${answer}`;
          reject(res.statusCode === 401 || res.statusCode === 409 ? new Refused(why) : new Error(why));
        });
      });
      req.on("error", reject);
      req.end(body === null ? undefined : body);
    });
  }

  post(path, document) {
    return this.call("POST", path, JSON.stringify(document));
  }

  log(line) {
    return this.post("/log", { line }); // or {"lines": [...]}, or a text/plain body
  }

  progress(percent, message) {
    return this.post("/progress", { percent, message }); // either may be left out
  }

  // The step's result: read back if an earlier attempt of this job kept it, else work()'s, kept now.
  async step(name, work) {
    const kept = await this.call("GET", `/steps/${encodeURIComponent(name)}`, null, "application/json", true);
    if (kept !== null) {
      await this.log(`step ${name}: kept by an earlier attempt, skipped`);
      return kept.toString();
    }
    const result = await work();
    await this.call("PUT", `/steps/${encodeURIComponent(name)}`, result, "application/octet-stream");
    await this.log(`step ${name}: done`);
    return result;
  }
}

const sleep = (seconds) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

function effect(line) {
  if (WORK_LOG) fs.appendFileSync(WORK_LOG, `${line}\n`);
}

const routes = {
  async "/report"(attempt, job, payload) {
    const items = Number(payload.items ?? 5);
    const pause = Number(payload.seconds_per_item ?? 1);
    for (let i = 1; i <= items; i++) {
      await sleep(pause); // the work on one item
      await attempt.log(`item ${i} of ${items} done`);
      await attempt.progress(Math.floor((i * 100) / items), `${i} of ${items} items`);
    }
    return [200, { items }];
  },

  async "/steps"(attempt, job, payload) {
    const order = String(payload.order ?? "unnamed");
    const seat = await attempt.step("reserve", () => {
      effect(`reserve ${order} ${job.attempt}`);
      return `seat-${order}-${job.attempt}`; // which attempt reserved it
    });
    if (payload.die_after_first_step && job.attempt === 1) {
      return [500, "the test hook: a crash between the steps\n"];
    }
    const receipt = await attempt.step("charge", () => {
      effect(`charge ${order} ${seat}`);
      return `paid-${seat}`;
    });
    return [200, { order, seat, receipt, attempt: job.attempt }];
  },

  async "/snooze"(attempt, job, payload) {
    const file = String(payload.file ?? "");
    if (!fs.existsSync(file)) {
      // 202: the attempt is over, the job comes back after `delay` with its attempt count unchanged (up
      // to the handler's max_snoozes). What this request answers now is not used.
      await attempt.post("/snooze", { delay: payload.delay ?? "30s" });
      return [200, "snoozed\n"];
    }
    const lines = fs.readFileSync(file, "utf8").split("\n").filter(Boolean).length;
    return [200, { file, lines, attempt: job.attempt }];
  },
};

function reply(res, status, body) {
  const data = Buffer.from(typeof body === "string" ? body : JSON.stringify(body));
  const type = typeof body === "string" ? "text/plain; charset=utf-8" : "application/json";
  res.writeHead(status, { "Content-Type": type, "Content-Length": data.length });
  res.end(data);
}

async function handle(req, body) {
  const route = req.method === "POST" ? routes[req.url] : undefined;
  if (!route) return [404, "no such route\n"];
  const job = { id: req.headers["jobcar-job-id"], attempt: Number(req.headers["jobcar-attempt"] || "1") };
  let payload;
  try {
    payload = JSON.parse(body.toString("utf8"));
    return await route(new Attempt(req.headers), job, payload ?? {});
  } catch (err) {
    if (err instanceof Refused) return [409, `stopped: ${err.message}\n`]; // not used: the attempt is over
    if (err instanceof SyntaxError || err instanceof TypeError) {
      return [422, `cannot process this job: ${err.message}\n`]; // a permanent failure
    }
    return [500, `temporary failure: ${err.message}\n`]; // retried with backoff
  }
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => handle(req, Buffer.concat(chunks)).then(([status, body]) => reply(res, status, body)));
});

server.listen(Number(process.env.PORT || 8080), process.env.HOST || "127.0.0.1", () => {
  process.stdout.write(`listening on ${server.address().port}\n`);
});
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
