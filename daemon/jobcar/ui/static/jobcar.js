// jobcar dashboard: the overview's live numbers and charts, and "select all" on the dead-letter page.
// Everything works without this script; it only adds. Values are written with textContent, never as HTML.
"use strict";

(function () {
  const REFRESH_MS = 5000;
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

  document.addEventListener("DOMContentLoaded", () => {
    selectAll();
    if (document.getElementById("queues")) {
      refresh();
      setInterval(refresh, REFRESH_MS);
      window.addEventListener("resize", fitCharts);
    }
  });
})();
