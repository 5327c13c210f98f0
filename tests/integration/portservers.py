"""The servers a job runs in its sandbox for the port proxy tests: stdlib only (the sandbox's python3 has no
websocket library). `SCRIPT` takes two ports: an HTTP server (files, a 10 MB file, a header echo, a body
digest on POST) and a websocket echo server (subprotocol `echo` when offered)."""

SCRIPT = r'''
import base64, hashlib, http.server, json, os, socket, socketserver, struct, sys, threading
http_port, ws_port = int(sys.argv[1]), int(sys.argv[2])
root = os.path.join(os.getcwd(), "site")
os.makedirs(root, exist_ok=True)
open(os.path.join(root, "hello.txt"), "w").write("door-ok")
with open(os.path.join(root, "big.bin"), "wb") as f:
    f.write(hashlib.sha256(b"seed").digest() * (10 * 1024 * 1024 // 32))
open(os.path.join(root, "index.html"), "w").write(
    "<!doctype html><html><head><title>loading</title><script src='app.js'></script></head>"
    "<body><h1 id='h'>hello from the sandbox</h1></body></html>")
open(os.path.join(root, "app.js"), "w").write("""
window.addEventListener('load', () => {
  document.title = 'sandbox app ran';
  const m = location.search.match(/ws=(\\d+)/);  // ?ws=PORT: a websocket to that port of the same session
  if (!m) return;
  const url = new URL('../' + m[1] + '/', location.href);
  url.protocol = url.protocol.replace('http', 'ws');
  const ws = new WebSocket(url.href, ['echo']);
  ws.onopen = () => ws.send('from the browser over ' + ws.protocol);
  ws.onmessage = (e) => { document.getElementById('h').textContent = 'echo: ' + e.data; };
  ws.onclose = (e) => { if (e.code !== 1000) document.getElementById('h').textContent = 'closed ' + e.code; };
});
""")
os.makedirs(os.path.join(root, "sub"), exist_ok=True)

class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *a, **kw):
        super().__init__(*a, directory=root, **kw)
    def log_message(self, *a):
        pass
    def _json(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Set-Cookie", "firepool_session=stolen; Path=/")
        self.send_header("Set-Cookie", "app=1; Path=/")
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path.startswith("/direct"):  # the 10 MB file fetched from inside the sandbox: the direct figure
            import time, urllib.request
            best = None
            for _ in range(3):
                start = time.perf_counter()
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/big.bin") as r:
                    while r.read(256 * 1024):
                        pass
                took = time.perf_counter() - start
                best = took if best is None else min(best, took)
            return self._json({"seconds": best})
        if self.path.startswith("/headers"):
            return self._json({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}})
        return super().do_GET()
    def do_POST(self):
        digest, n = hashlib.sha256(), 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunk = self.rfile.read(size); self.rfile.readline()
                digest.update(chunk); n += len(chunk)
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left:
                chunk = self.rfile.read(min(left, 65536)); left -= len(chunk)
                digest.update(chunk); n += len(chunk)
        self._json({"bytes": n, "sha256": digest.hexdigest(), "type": self.headers.get("Content-Type")})
    do_PUT = do_POST

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

def read_exact(f, n):
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return data

def frame(opcode, payload):
    n = len(payload)
    head = bytes([0x80 | opcode])
    head += bytes([n]) if n < 126 else (bytes([126]) + struct.pack(">H", n) if n < 65536 else bytes([127]) + struct.pack(">Q", n))
    return head + payload

class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        lines = []
        while True:
            line = self.rfile.readline().decode("latin-1").strip()
            if not line:
                break
            lines.append(line)
        headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
        accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + GUID).encode()).digest()).decode()
        reply = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + "\r\n"
        if "echo" in [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]:
            reply += "Sec-WebSocket-Protocol: echo\r\n"
        self.wfile.write((reply + "\r\n").encode()); self.wfile.flush()
        try:
            while True:
                b1, b2 = read_exact(self.rfile, 2)
                opcode, n = b1 & 0x0F, b2 & 0x7F
                if n == 126:
                    n = struct.unpack(">H", read_exact(self.rfile, 2))[0]
                elif n == 127:
                    n = struct.unpack(">Q", read_exact(self.rfile, 8))[0]
                mask = read_exact(self.rfile, 4) if b2 & 0x80 else b"\0\0\0\0"
                payload = bytes(c ^ mask[i % 4] for i, c in enumerate(read_exact(self.rfile, n)))
                if opcode == 8:
                    self.wfile.write(frame(8, payload[:2])); self.wfile.flush()
                    return
                if opcode == 9:
                    self.wfile.write(frame(10, payload))
                elif opcode in (1, 2):
                    if payload == b"big please":
                        payload = b"x" * (256 * 1024)
                    self.wfile.write(frame(opcode, payload))
                self.wfile.flush()
        except (EOFError, OSError):
            return

class Threaded(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

ws = Threaded(("127.0.0.1", ws_port), Echo)
threading.Thread(target=ws.serve_forever, daemon=True).start()
http.server.ThreadingHTTPServer.daemon_threads = True
http.server.ThreadingHTTPServer(("127.0.0.1", http_port), Handler).serve_forever()
'''
