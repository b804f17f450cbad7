"""A stand-in for a vLLM server process in supervisor tests (crashes on demand).

Usage: fake_engine.py PORT [--die-after SECONDS] [--worker]
Serves GET /health; GET /crash makes it exit with code 3. --worker starts a child process in
the same process group, the way vLLM starts its engine core and TP workers.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/crash":
            self.send_response(200)
            self.end_headers()
            os._exit(3)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        print("request", self.path, flush=True)


def main() -> None:
    port = int(sys.argv[1])
    if "--worker" in sys.argv:
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"worker {worker.pid}", flush=True)
    if "--die-after" in sys.argv:
        delay = float(sys.argv[sys.argv.index("--die-after") + 1])
        threading.Timer(delay, lambda: os._exit(4)).start()
    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    print(f"listening {port} pid {os.getpid()} at {time.time()}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
