// Firepool dashboard: the terminal page. xterm.js (vendored, MIT) on a websocket to the broker's
// /ui/sessions/{tag}/terminal/ws, terminado-style JSON frames. Nothing is fetched from elsewhere.
"use strict";
(function () {
  // xterm.js adds <style> elements; the page's CSP admits them by this response's nonce only.
  const nonce = document.currentScript && document.currentScript.nonce;
  const create = Document.prototype.createElement;
  document.createElement = function (tag, options) {
    const el = create.call(this, tag, options);
    if (nonce && String(tag).toLowerCase() === "style") el.nonce = nonce;
    return el;
  };

  function start() {
    const box = document.getElementById("terminal");
    const status = document.getElementById("terminal-status");
    if (!box || !window.Terminal) return;
    const term = new window.Terminal({ cursorBlink: true, scrollback: 5000, convertEol: false });
    const fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    const q = new URLSearchParams({ queue: box.dataset.queue, rows: term.rows, cols: term.cols });
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(scheme + "//" + location.host + "/ui/sessions/" +
                             encodeURIComponent(box.dataset.tag) + "/terminal/ws?" + q);
    const send = (frame) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(frame)); };
    ws.onopen = () => { status.textContent = "connected"; term.focus(); };
    ws.onmessage = (event) => {
      const [kind, value] = JSON.parse(event.data);
      if (kind === "stdout") term.write(value);
      else if (kind === "exit") status.textContent = "the shell exited with code " + value;
    };
    ws.onclose = (event) => {
      if (!/exited/.test(status.textContent)) {
        status.textContent = event.code === 1006 ? "could not connect (is the session live, and is it yours?)"
          : "closed (" + event.code + (event.reason ? ": " + event.reason : "") + ")";
      }
      term.options.disableStdin = true;
    };
    term.onData((data) => send(["stdin", data]));
    term.onResize(({ rows, cols }) => send(["set_size", rows, cols]));
    window.addEventListener("resize", () => fit.fit());
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
