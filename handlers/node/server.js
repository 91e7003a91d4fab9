#!/usr/bin/env node
// server.js: an example jobcar *HTTP* handler in Node.js, standard library only (no npm packages).
//
//   PORT=8080 node handlers/node/server.js        (PORT=0 picks a free port; either way the first line
//                                                   on stdout is "listening on <port>")
//
// Protocol (README "Handlers"): jobcar sends `POST <url>` with the payload bytes as the body and the
// job's metadata in headers: Jobcar-Job-Id, Jobcar-Job-Type, Jobcar-Queue, Jobcar-Attempt (1-based),
// Jobcar-Max-Attempts, Jobcar-Enqueued-At, Jobcar-Deadline (RFC 3339), traceparent. The answer decides:
//
//   2xx                     success; the body (here a small JSON object) becomes the job's result
//   429/503 + Retry-After   "not now": jobcar tries again after that many seconds, no attempt spent
//   408, 425, 429, 5xx      temporary failure: retried with backoff, spending an attempt
//   any other 4xx           permanent failure: the job goes to the dead-letter queue at once
//
// With `signing_secret` in the handler config, jobcar adds Jobcar-Timestamp (unix seconds) and
// Jobcar-Signature: v1=<hex HMAC-SHA256 of "<timestamp>." + body>. Set the same secret here in
// JOBCAR_SIGNING_SECRET and unsigned, forged or stale (> 300 s) requests get 401 (→ dead-letter queue).
//
// The work: POST /jobs/<type> with {"text": "..."} counts its words. Test hooks in the payload:
// {"fail_attempts": N} answers 500 to attempts 1..N; {"busy_for": N} answers 503 + Retry-After: 2 to
// the first N deliveries of the job. WORK_LOG=<file> appends "<job id> <attempt>" each time the work
// is really done (it stands in for a side effect that must not happen twice: an email, a payment).
//
// Config:
//   handlers:
//     text.count:
//       url: http://127.0.0.1:8080/jobs/text.count
//       signing_secret: ${JOBCAR_SIGNING_SECRET}
"use strict";

const http = require("node:http");
const crypto = require("node:crypto");
const fs = require("node:fs");

const SECRET = process.env.JOBCAR_SIGNING_SECRET || "";
const TOLERANCE_S = 300;
const MAX_BODY = 1024 * 1024;
const WORK_LOG = process.env.WORK_LOG || "";

// Idempotency: job id → the result sent back. Jobs are delivered at least once, so a redelivery of a
// completed job gets the same answer without the work being redone. In memory for the example; a real
// handler keeps this where its work lands (a table with a unique key on the job id), so it survives a
// restart.
const done = new Map();
// Deliveries per job id, only for the busy_for test hook.
const seen = new Map();

function reply(res, status, body, headers = {}) {
  const data = Buffer.from(typeof body === "string" ? body : JSON.stringify(body));
  const type = typeof body === "string" ? "text/plain; charset=utf-8" : "application/json";
  res.writeHead(status, { "Content-Type": type, "Content-Length": data.length, ...headers });
  res.end(data);
}

// Check Jobcar-Timestamp and Jobcar-Signature against the raw body, before parsing it. The header may
// hold several comma-separated v1= values (during a secret rotation): one match is enough.
function signatureValid(timestamp, signature, body) {
  if (!/^[0-9]{1,12}$/.test(timestamp || "") || !signature) return false;
  if (Math.abs(Date.now() / 1000 - Number(timestamp)) > TOLERANCE_S) return false;
  const mac = crypto.createHmac("sha256", SECRET).update(`${timestamp}.`).update(body).digest("hex");
  const expected = Buffer.from(`v1=${mac}`);
  return signature.split(",").some((candidate) => {
    const given = Buffer.from(candidate.trim());
    // timingSafeEqual throws on different lengths; the length of a signature is no secret.
    return given.length === expected.length && crypto.timingSafeEqual(given, expected);
  });
}

function handle(req, res, body) {
  const match = /^\/jobs\/([A-Za-z0-9._:-]+)$/.exec(req.url);
  if (!match) return reply(res, 404, "no such job type\n");
  if (req.method !== "POST") return reply(res, 405, "POST only\n", { Allow: "POST" });
  if (SECRET && !signatureValid(req.headers["jobcar-timestamp"], req.headers["jobcar-signature"], body)) {
    return reply(res, 401, "bad or missing Jobcar-Signature\n");
  }
  const jobId = req.headers["jobcar-job-id"];
  const attempt = Number(req.headers["jobcar-attempt"] || "1");
  if (!jobId) return reply(res, 400, "missing Jobcar-Job-Id\n");

  if (done.has(jobId)) return reply(res, 200, done.get(jobId)); // a redelivery: same answer, no work

  let payload;
  try {
    payload = JSON.parse(body.toString("utf8"));
  } catch {
    payload = undefined;
  }
  if (payload === null || typeof payload !== "object" || typeof payload.text !== "string") {
    // 422: retrying cannot fix this payload, so jobcar moves the job to the dead-letter queue.
    return reply(res, 422, 'cannot process payload: expected {"text": "<string>"}\n');
  }
  const deliveries = (seen.get(jobId) || 0) + 1;
  seen.set(jobId, deliveries);
  if (deliveries <= (payload.busy_for || 0)) {
    // Overloaded: ask for a later slot. With 429 or 503 + Retry-After, jobcar does not spend an attempt.
    return reply(res, 503, "busy, come back later\n", { "Retry-After": "2" });
  }
  if (attempt <= (payload.fail_attempts || 0)) {
    // Something temporary went wrong (a dependency is down): 500 → retried with backoff.
    return reply(res, 500, `temporary failure on attempt ${attempt}\n`);
  }

  // The work, then the record of it, then the answer.
  const result = { job_id: jobId, type: match[1], attempt, words: payload.text.split(/\s+/).filter(Boolean).length };
  if (WORK_LOG) fs.appendFileSync(WORK_LOG, `${jobId} ${attempt}\n`);
  done.set(jobId, result);
  seen.delete(jobId);
  console.error(`server.js: job ${jobId} (${match[1]}) done on attempt ${attempt}`);
  return reply(res, 200, result);
}

const server = http.createServer((req, res) => {
  const chunks = [];
  let size = 0;
  req.on("data", (chunk) => {
    size += chunk.length;
    if (size > MAX_BODY) {
      reply(res, 413, "payload too large\n"); // a 4xx: the job goes to the dead-letter queue
      req.destroy();
    } else {
      chunks.push(chunk);
    }
  });
  req.on("end", () => {
    try {
      handle(req, res, Buffer.concat(chunks));
    } catch (err) {
      console.error(err);
      if (!res.headersSent) reply(res, 500, "internal error\n"); // unexpected: let jobcar retry
    }
  });
});

server.listen(Number(process.env.PORT || 8080), process.env.HOST || "127.0.0.1", () => {
  // The only line on stdout: a test (or a supervisor) reads the port from it.
  process.stdout.write(`listening on ${server.address().port}\n`);
});
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
