// Firepool dashboard: one SSE stream per page (throttled by the broker to <= 2 events/s), the job log
// stream, uPlot charts, and keyboard shortcuts. Plain JS, no framework, nothing fetched from elsewhere.
"use strict";
(function () {
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
  const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

  function text(el, value) { if (el && el.textContent !== value) el.textContent = value; }
  function esc(s) {  // safe in text and in double-quoted attributes
    const d = document.createElement("span");
    d.textContent = s == null ? "" : String(s);
    return d.innerHTML.replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  }
  function utc(ts) { return ts ? new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) : "—"; }
  function status(msg) { text($("#live-status"), msg); }
  // The same words as the server's filters (broker/ui/templating.py): a live update reads like the page.
  function duration(s) {
    if (s == null) return "—";
    if (s < 1) return Math.round(s * 1000) + " ms";
    if (s < 120) return s.toFixed(2) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function elapsed(started, finished, now) {
    if (!started) return "—";
    if (finished) return duration(Math.max(0, finished - started));
    return "running for " + duration(Math.max(0, now - started));
  }
  function placeable(shapes) {
    const keys = Object.keys(shapes || {});
    if (!keys.length) return "—";
    const digits = (k) => /^[0-9]+$/.test(k);
    keys.sort((a, b) => (digits(a) !== digits(b) ? (digits(a) ? -1 : 1) :
      digits(a) ? Number(a) - Number(b) : (a < b ? -1 : a > b ? 1 : 0)));
    const shape = (k) => (k === "node" ? "whole nodes" : digits(k) ? k + (k === "1" ? " GPU" : " GPUs") : k);
    return keys.map((k) => shape(k) + ": " + shapes[k]).join(", ");
  }
  function nowS() { return Date.now() / 1000; }

  // ---------------------------------------------------------------- pools
  function heldBy(map) {
    const parts = Object.entries(map || {}).map(([o, n]) => o + ": " + n);
    return parts.length ? parts.join(", ") : "none";
  }
  function renderPools(pools) {
    for (const p of pools) {
      for (const cell of $$('[data-pool="' + CSS.escape(p.name) + '"]')) {
        const f = cell.dataset.field;
        if (f === "held_by") text(cell, heldBy(p.held_by));
        else if (f === "last_plan") text(cell, p.last_plan ? "create " + p.last_plan.create + ", retire " + p.last_plan.retire + ": " + p.last_plan.reason : "none yet");
        else if (f === "largest_placeable") text(cell, placeable(p.largest_placeable));
        else if (f === "budget") continue;
        else if (f in p) text(cell, String(p[f]));
      }
    }
  }

  // ---------------------------------------------------------------- jobs
  function outcome(j) {
    if (j.error_class) return j.error_class + (j.exit_code != null ? " (exit " + j.exit_code + ")" : "");
    if (j.exit_code != null) return "exit " + j.exit_code;
    if (j.waiting_reason) return "waiting: " + j.waiting_reason;
    return "—";
  }
  function stateCell(s) { return '<span class="state state-' + esc(s.toLowerCase()) + '">' + esc(s) + "</span>"; }
  function csrf() { const i = $('input[name="csrf"]'); return i ? i.value : ""; }
  function cancelForm(j) {
    return '<form method="post" action="/ui/jobs/' + encodeURIComponent(j.id) + '/cancel"><input type="hidden" name="csrf" value="' +
      esc(csrf()) + '"><input type="hidden" name="back" value="' + esc(location.pathname + location.search) +
      '"><button type="submit" data-action="cancel">Cancel</button></form>';
  }
  function jobRow(j, me) {
    const tr = document.createElement("tr");
    tr.dataset.job = j.id;
    tr.innerHTML = '<td><a href="/ui/jobs/' + encodeURIComponent(j.id) + '">' + esc(j.id) + "</a></td>" +
      '<td data-field="state">' + stateCell(j.state) + "</td><td>" + esc(j.caller) + "</td><td>" + esc(j.pool) +
      "</td><td>" + esc(j.lease_tag || "—") + '</td><td data-field="path">' + esc(j.path || "—") +
      '</td><td data-field="outcome">' + esc(outcome(j)) + '</td><td data-field="command" class="cmd"><code title="' +
      esc(j.command) + '">' + esc(j.command) + '</code></td><td data-field="duration" data-started="' +
      esc(j.started_at || "") + '" data-finished="' + esc(j.finished_at || "") + '">' +
      esc(elapsed(j.started_at, j.finished_at, nowS())) + "</td><td>" + esc(utc(j.submitted_at)) +
      '</td><td data-field="action">' + (j.caller === me && !TERMINAL.has(j.state) ? cancelForm(j) : "") + "</td>";
    return tr;
  }
  function setDuration(cell, j) {
    if (!cell) return;
    cell.dataset.started = j.started_at || "";
    cell.dataset.finished = j.finished_at || "";
    text(cell, elapsed(j.started_at, j.finished_at, nowS()));
  }
  function tickDurations() {  // "running for" counts up between live updates
    for (const cell of $$('[data-field="duration"][data-started]')) {
      if (cell.dataset.started && !cell.dataset.finished) {
        text(cell, elapsed(Number(cell.dataset.started), null, nowS()));
      }
    }
  }
  function matches(table, j) {
    const d = table.dataset;
    return (!d.filterState || d.filterState === j.state) && (!d.filterPool || d.filterPool === j.pool) &&
      (!d.filterTag || d.filterTag === j.lease_tag) && (!d.filterPath || d.filterPath === j.path) &&
      (!d.filterCaller || d.filterCaller === j.caller);
  }
  function renderJobs(jobs) {
    const table = $("#jobs");
    if (table) {
      const body = $("tbody", table);
      for (const j of jobs.slice().reverse()) {
        const row = $('tr[data-job="' + CSS.escape(j.id) + '"]', body);
        if (row) {
          const st = $('[data-field="state"]', row);
          if (st && st.textContent !== j.state) st.innerHTML = stateCell(j.state);
          text($('[data-field="path"]', row), j.path || "—");
          text($('[data-field="outcome"]', row), outcome(j));
          setDuration($('[data-field="duration"]', row), j);
          const act = $('[data-field="action"]', row);
          if (act && TERMINAL.has(j.state) && act.firstChild) act.textContent = "";
        } else if (table.dataset.firstPage === "yes" && matches(table, j)) {
          const first = body.firstElementChild;
          if (first && first.classList.contains("empty")) first.remove();
          const newest = body.firstElementChild;
          if (!newest || !newest.dataset.job || newest.dataset.job < j.id) body.prepend(jobRow(j, table.dataset.me));
        }
      }
    }
    const page = $("[data-job-page]");
    if (page) {
      const j = jobs.find((x) => x.id === page.dataset.jobPage);
      if (j && j.state !== page.dataset.state && !page.dataset.reloading) {
        page.dataset.reloading = "1";  // the new state brings attempts, phases and acquisition: re-render once
        setTimeout(() => location.reload(), TERMINAL.has(j.state) ? 1200 : 300);
      }
    }
  }

  // ---------------------------------------------------------------- pods
  function renderPods(pods) {
    const byName = new Map(pods.map((p) => [p.name, p]));
    for (const row of $$("tr[data-pod], span[data-pod]")) {
      const p = byName.get(row.dataset.pod);
      if (!p) { text($('[data-field="state"]', row), "gone"); continue; }
      if (row.tagName === "TR") {
        text($('[data-field="state"]', row), p.state + (p.held ? " (held)" : "") + (p.retire_at_release ? " (retires at release)" : ""));
        text($('[data-field="caller"]', row), p.caller || "—");
        text($('[data-field="lease_tag"]', row), p.lease_tag || "—");
      } else {
        text($('[data-field="state"]', row), p.state);
      }
    }
  }

  // ---------------------------------------------------------------- SSE
  function live() {
    const topic = document.body.dataset.live;
    if (!topic || !window.EventSource) return;
    const es = new EventSource("/ui/events?topics=" + encodeURIComponent(topic));
    es.onopen = () => status("live");
    es.onerror = () => status("reconnecting…");
    es.onmessage = (ev) => {
      const data = JSON.parse(ev.data);
      if (data.pools) renderPools(data.pools);
      if (data.jobs) renderJobs(data.jobs);
      if (data.pods) renderPods(data.pods);
      status("live · updated " + utc(Date.now() / 1000) + " UTC");
    };
    window.addEventListener("pagehide", () => es.close());
  }

  function logStream() {
    const pre = $("#log");
    if (!pre || !window.EventSource) return;
    const es = new EventSource(pre.dataset.log);
    const st = $("#log-status");
    text(st, "streaming…");
    es.onmessage = (ev) => {
      const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.append(JSON.parse(ev.data));
      if (stick) pre.scrollTop = pre.scrollHeight;
    };
    es.addEventListener("end", (ev) => {
      es.close();
      const info = JSON.parse(ev.data || "{}");
      text(st, info.error ? "log unavailable: " + info.error : "end of output");
      pre.dataset.complete = "1";
    });
    es.onerror = () => { es.close(); text(st, "log stream closed"); };
  }

  // ---------------------------------------------------------------- charts
  const TICKS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
    172800, 604800];
  function ticks(u, splits) {  // HH:MM:SS within two days, MM-DD HH:MM beyond
    const wide = splits.length > 1 && splits[splits.length - 1] - splits[0] >= 172800;
    return splits.map((v) => new Date(v * 1000).toISOString().slice(wide ? 5 : 11, wide ? 16 : 19).replace("T", " "));
  }
  function css(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
  function plot(el, series, data, yLabel) {
    if (!window.uPlot || !el) return null;
    const width = Math.max(300, Math.min(900, el.parentElement.clientWidth || 600));
    const opts = {
      width: width, height: 180,
      // x: one line per tick (UTC, as the tables), ticks at least 90 px and a whole second apart: uPlot's
      // default put the date under the first tick and packed the ticks so the first two labels overlapped.
      axes: [{ stroke: css("--fg"), grid: { stroke: css("--line") }, space: 90, incrs: TICKS, values: ticks },
             { stroke: css("--fg"), grid: { stroke: css("--line") }, label: yLabel }],
      series: [{}].concat(series.map((s, i) => ({ label: s, stroke: css("--p" + (i + 1)), width: 2,
        dash: i === 0 ? undefined : i === 1 ? [6, 3] : [2, 3] }))),
    };
    el.textContent = "";
    el.uplot = new window.uPlot(opts, data, el);
    return el.uplot;
  }
  function timelines() {
    const node = $("#timeline-data");
    if (!node) return;
    const draw = (all) => {
      for (const el of $$("[data-timeline]")) {
        const s = all[el.dataset.timeline];
        if (!s || !s.at.length) { el.textContent = "No samples yet."; continue; }
        plot(el, ["held", "busy", "queued"], [s.at, s.held, s.busy, s.queued], "pods");
      }
    };
    draw(JSON.parse(node.textContent));
    setInterval(() => fetch("/ui/timeline.json", { credentials: "same-origin" })
      .then((r) => (r.ok ? r.json() : null)).then((d) => d && draw(d)).catch(() => {}), 30000);
  }
  function share() {
    const node = $("#share-data");
    const el = $("[data-share]");
    if (!node || !el) return;
    const s = JSON.parse(node.textContent);
    if (!s.at.length) { el.textContent = "No started jobs yet."; return; }
    plot(el, ["warm %"], [s.at, s.warm], "% warm");
  }

  // ---------------------------------------------------------------- small enhancements
  function confirms() {
    for (const b of $$("button[data-confirm]")) {
      b.addEventListener("click", (ev) => { if (!window.confirm(b.dataset.confirm)) ev.preventDefault(); });
    }
  }
  function keys() {
    let g = false;
    document.addEventListener("keydown", (ev) => {
      const t = ev.target;
      if (ev.ctrlKey || ev.metaKey || ev.altKey || (t && /INPUT|SELECT|TEXTAREA/.test(t.tagName))) return;
      if (ev.key === "g") { g = true; setTimeout(() => { g = false; }, 1500); return; }
      if (!g) return;
      g = false;
      const link = $('nav a[data-key="' + ev.key + '"]');
      if (link) link.click();
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    live(); logStream(); timelines(); share(); confirms(); keys();
    if ($('[data-field="duration"][data-started]')) setInterval(tickDurations, 1000);
  });
})();
