// Firepool dashboard: one SSE stream per page (throttled by the broker to <= 2 events/s), the job log
// stream, uPlot charts, and keyboard shortcuts. Plain JS, no framework, nothing fetched from elsewhere.
"use strict";
(function () {
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
  const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

  function text(el, value) { if (el && el.textContent !== value) el.textContent = value; }
  function esc(s) { const d = document.createElement("span"); d.textContent = s == null ? "" : String(s); return d.innerHTML; }
  function utc(ts) { return ts ? new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) : "—"; }
  function status(msg) { text($("#live-status"), msg); }

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
  function jobRow(j) {
    const tr = document.createElement("tr");
    tr.dataset.job = j.id;
    tr.innerHTML = '<td><a href="/ui/jobs/' + encodeURIComponent(j.id) + '">' + esc(j.id) + "</a></td>" +
      '<td data-field="state">' + stateCell(j.state) + "</td><td>" + esc(j.caller) + "</td><td>" + esc(j.pool) +
      "</td><td>" + esc(j.lease_tag || "—") + '</td><td data-field="path">' + esc(j.path || "—") +
      '</td><td data-field="outcome">' + esc(outcome(j)) + "</td><td>" + esc(utc(j.submitted_at)) + "</td>";
    return tr;
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
        } else if (table.dataset.firstPage === "yes" && matches(table, j)) {
          const first = body.firstElementChild;
          if (first && first.classList.contains("empty")) first.remove();
          const newest = body.firstElementChild;
          if (!newest || !newest.dataset.job || newest.dataset.job < j.id) body.prepend(jobRow(j));
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
  function css(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
  function plot(el, series, data, yLabel) {
    if (!window.uPlot || !el) return null;
    const width = Math.max(300, Math.min(900, el.parentElement.clientWidth || 600));
    const opts = {
      width: width, height: 180,
      axes: [{ stroke: css("--fg"), grid: { stroke: css("--line") } },
             { stroke: css("--fg"), grid: { stroke: css("--line") }, label: yLabel }],
      series: [{}].concat(series.map((s, i) => ({ label: s, stroke: css("--p" + (i + 1)), width: 2,
        dash: i === 0 ? undefined : i === 1 ? [6, 3] : [2, 3] }))),
    };
    el.textContent = "";
    return new window.uPlot(opts, data, el);
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
  });
})();
