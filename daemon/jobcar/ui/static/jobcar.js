// jobcar dashboard: the overview's live numbers and charts, a running job's progress, log, steps and children,
// and "select all" on the dead-letter page.
// Everything works without this script; it only adds. Values are written with textContent, never as HTML.
"use strict";

(function () {
  const REFRESH_MS = 5000;
  const JOB_REFRESH_MS = 2000;
  const charts = new Map();

  function minuteLabel(ms) {
    const d = new Date(ms);
    return String(d.getHours()).padStart(2, "0") + ":" + String(d.getMinutes()).padStart(2, "0");
  }

  // As the server writes durations (cli_format.span): 0.4s, 12s, 5m03s, 2h10m, 3d04h.
  function seconds(value) {
    if (value < 10) return Math.max(0, value).toFixed(1) + "s";
    const whole = Math.floor(value);
    const two = (n) => String(n).padStart(2, "0");
    if (whole < 60) return whole + "s";
    if (whole < 3600) return Math.floor(whole / 60) + "m" + two(whole % 60) + "s";
    if (whole < 86400) return Math.floor(whole / 3600) + "h" + two(Math.floor((whole % 3600) / 60)) + "m";
    return Math.floor(whole / 86400) + "d" + two(Math.floor((whole % 86400) / 3600)) + "h";
  }

  function drawChart(figure, queue) {
    const width = Math.max(200, figure.clientWidth);
    const data = [queue.minutes.map((ms) => ms / 1000), queue.done, queue.failed];
    let chart = charts.get(queue.queue);
    if (chart) {
      chart.setData(data);
      return;
    }
    if (typeof uPlot === "undefined") return;
    chart = new uPlot({
      width: width, height: 160,
      scales: { x: { time: true } },
      axes: [{ values: (u, ticks) => ticks.map((t) => minuteLabel(t * 1000)) }, {}],
      series: [{}, { label: "done", stroke: "#2e7d32", width: 1.5 }, { label: "failed", stroke: "#c62828", width: 1.5 }],
      legend: { show: false },
    }, data, figure);
    charts.set(queue.queue, chart);
  }

  function updateRow(row, queue) {
    for (const cell of row.querySelectorAll("[data-field]")) {
      const field = cell.dataset.field;
      let text;
      if (field === "latency_s") text = seconds(queue.latency_s);
      else if (field === "paused") text = queue.paused ? "paused" : "running";
      else text = String(queue[field]);
      const target = cell.querySelector("a") || cell;
      if (target.textContent !== text) target.textContent = text;
    }
  }

  function updateDaemons(daemons, nowMs) {
    const body = document.querySelector("#daemons tbody");
    if (!body) return;
    body.replaceChildren();
    for (const d of daemons) {
      const row = document.createElement("tr");
      const started = seconds(Math.max(0, (nowMs - d.started_ms) / 1000)) + " ago";
      for (const [text, numeric] of [[d.host, false], [String(d.pid), true], [d.version, false],
        [d.queues.join(", "), false], [String(d.in_flight), true], [String(d.concurrency), true], [started, false]]) {
        const cell = document.createElement("td");
        cell.textContent = text;
        if (numeric) cell.className = "num";
        row.appendChild(cell);
      }
      body.appendChild(row);
    }
    if (!daemons.length) {
      const row = document.createElement("tr");
      const cell = document.createElement("td");
      cell.colSpan = 7;
      cell.textContent = "No daemon has announced itself in the last 15 seconds.";
      row.appendChild(cell);
      body.appendChild(row);
    }
  }

  async function refresh() {
    let overview;
    try {
      const response = await fetch("/ui/overview.json", { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) return;
      overview = await response.json();
    } catch (error) {
      return; // the daemon restarts or the network blinks: the next round tries again
    }
    for (const queue of overview.queues) {
      const row = document.querySelector('#queues tr[data-queue="' + CSS.escape(queue.queue) + '"]');
      if (row) updateRow(row, queue);
      const figure = document.querySelector('figure[data-chart="' + CSS.escape(queue.queue) + '"]');
      if (figure) drawChart(figure, queue);
    }
    updateDaemons(overview.daemons, overview.now_ms);
    document.body.dataset.refreshed = String(overview.now_ms);
  }

  function fitCharts() {
    for (const [queue, chart] of charts) {
      const figure = document.querySelector('figure[data-chart="' + CSS.escape(queue) + '"]');
      if (figure) chart.setSize({ width: Math.max(200, figure.clientWidth), height: 160 });
    }
  }

  function selectAll() {
    for (const box of document.querySelectorAll("input.select-all")) {
      box.addEventListener("change", () => {
        for (const other of box.closest("table").querySelectorAll('input[name="id"]')) other.checked = box.checked;
      });
    }
  }

  // A job's page while the job has not finished: what its handler writes (ui/job_page.py `job_json`). Every value is
  // the handler's own text: written with textContent only.
  function element(tag, text, className) {
    const made = document.createElement(tag);
    if (text !== undefined) made.textContent = text;
    if (className) made.className = className;
    return made;
  }

  function show(id, shown) {
    const found = document.getElementById(id);
    if (found) found.hidden = !shown;
  }

  function setText(id, text) {
    const found = document.getElementById(id);
    if (found && found.textContent !== text) found.textContent = text;
  }

  function updateJob(job) {
    const state = document.getElementById("job-state");
    if (state) {
      state.textContent = job.state;
      state.className = "state state-" + job.state;
    }
    const p = job.progress;
    show("job-progress", p !== null);
    show("job-no-progress", p === null);
    if (p !== null) {
      const bar = document.querySelector("#job-progress progress");
      if (p.percent === null) bar.removeAttribute("value");
      else bar.value = p.percent;
      const text = document.getElementById("job-progress-text");
      text.querySelector(".percent").textContent = p.percent_text === null ? "" : p.percent_text;
      text.querySelector(".message").textContent = p.message === null ? "" : p.message;
      text.querySelector(".when").textContent = "attempt " + p.attempt + ", " + p.at;
    }
    const log = job.log;
    let summary = "No lines.";
    if (log.lines || log.dropped) {
      summary = log.lines + " line(s) kept" + (log.dropped ? ", " + log.dropped + " older dropped" : "") +
        (log.lines > log.shown ? "; the last " + log.shown + " shown" : "") + " (jobcar jobs logs prints them all).";
    }
    setText("job-log-summary", summary);
    const lines = document.getElementById("job-log");
    if (lines) {
      lines.replaceChildren(...log.lines_read.map((e) => {
        const item = element("li");
        item.append(element("time", e.at || "—", "when"), " ", element("span", "#" + e.attempt, "attempt"), " ",
          element("span", e.line, "line"));
        return item;
      }));
    }
    const steps = document.querySelector("#job-steps tbody");
    if (steps) {
      steps.replaceChildren(...job.steps.map((step) => {
        const row = element("tr");
        row.append(element("td", step.name), element("td", step.size, "num"), element("td", step.at || "—"));
        return row;
      }));
    }
    show("job-steps", job.steps.length > 0);
    show("job-no-steps", job.steps.length === 0);
    const children = document.getElementById("job-children");
    if (children) {
      children.replaceChildren(...job.children.map((child) => {
        const item = element("li");
        const link = element("a", child.ref);
        if (child.link.startsWith("/ui/job?")) link.href = child.link;
        const state = child.state === null ? "gone" : child.state;
        item.append(link, " ", element("span", state, "state state-" + state));
        return item;
      }));
    }
    const shown = job.children.length;
    setText("job-children-summary", job.children_total ? job.children_total + " child job(s)" +
      (job.children_total > shown ? "; the first " + shown + " shown" : "") + "." : "None.");
  }

  function followJob(section) {
    const url = section.dataset.live;
    let timer = null;
    async function round() {
      let job;
      try {
        const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
        if (response.status === 404) {  // gone: it ended without a kept result, or was canceled
          clearInterval(timer);
          setText("job-state", "gone");
          return;
        }
        if (!response.ok) return;
        job = await response.json();
      } catch (error) {
        return; // the next round tries again
      }
      updateJob(job);
      document.body.dataset.refreshed = String(Date.now());
      if (job.finished) clearInterval(timer);
    }
    timer = setInterval(round, JOB_REFRESH_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    selectAll();
    const live = document.querySelector("#job-live[data-live]");
    if (live) followJob(live);
    if (document.getElementById("queues")) {
      refresh();
      setInterval(refresh, REFRESH_MS);
      window.addEventListener("resize", fitCharts);
    }
  });
})();
