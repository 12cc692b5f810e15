"""Runs inside a test pod on the real node (python3 of the Debian base image, stdlib only).

Serves its own name over HTTP on port 8080, resolves its peer's headless-Service name through
the cluster DNS, fetches the peer's name from the peer's pod IP, connects to the API server
through the ``kubernetes`` Service, prints one JSON line with what it saw, and exits 0 once the
peer has fetched from it too (so neither pod leaves before the other is done).
"""

import http.server
import json
import os
import socket
import threading
import time
import urllib.request

SELF = os.environ["SELF"]
PEER_FQDN = os.environ["PEER_FQDN"]
served = threading.Event()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = SELF.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        served.set()

    def log_message(self, format: str, *args: object) -> None:
        """No access log: the test reads this pod's JSON line as the log's last, and a peer
        that retried after a slow answer would otherwise log a request after it."""


server = http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()

deadline = time.monotonic() + 90
peer_ip, reply, error = "", "", ""
while time.monotonic() < deadline:
    try:
        peer_ip = socket.gethostbyname(PEER_FQDN)
        with urllib.request.urlopen(f"http://{peer_ip}:8080/", timeout=5) as response:
            reply = response.read().decode()
        break
    except OSError as exc:
        error = repr(exc)
        time.sleep(0.5)

api_ip = socket.gethostbyname("kubernetes.default.svc.cluster.local")
with socket.create_connection((api_ip, 443), timeout=10):
    api_reachable = True

peer_done = served.wait(90)
result = {
    "self": SELF,
    "selfIp": socket.gethostbyname(socket.gethostname()),
    "peerIp": peer_ip,
    "peerReply": reply,
    "lastError": error,
    "apiServiceIp": api_ip,
    "apiReachable": api_reachable,
    "peerFetchedFromMe": peer_done,
}
print(json.dumps(result), flush=True)
time.sleep(2)  # let the peer finish reading before this pod's IP goes away
