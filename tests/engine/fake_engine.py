"""A stand-in for a vLLM server process in supervisor tests (crashes on demand).

Usage: fake_engine.py PORT [--die-after SECONDS] [--worker] [--load-mib N] [--ignore-term]
Serves GET /health; GET /crash makes it exit with code 3. --worker starts a child process in
the same process group, the way vLLM starts its engine core and TP workers. --load-mib makes
that worker hold N MiB and then log vLLM's "Loading weights took" line before /health answers.
--ignore-term: SIGTERM does nothing (a server hung in its shutdown).
"""

from __future__ import annotations

import http.server
import os
import signal
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
    if "--ignore-term" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "--worker" in sys.argv:
        load_mib = (
            int(sys.argv[sys.argv.index("--load-mib") + 1]) if "--load-mib" in sys.argv else 0
        )
        code = (
            "import sys, time\n"
            f"held = bytearray({load_mib} * 2**20)  # zero-filled: every page resident\n"
            "time.sleep(0.5)\n"
            "print('(Worker pid=1) INFO [default_loader.py:501] Loading weights took 0.25 seconds'"
            " if held else 'no load', flush=True)\n"
            "time.sleep(600)\n"
        )
        worker = subprocess.Popen([sys.executable, "-c", code])
        print(f"worker {worker.pid}", flush=True)
        if load_mib:
            time.sleep(1.5)  # vLLM answers /health only after its workers loaded
    if "--die-after" in sys.argv:
        delay = float(sys.argv[sys.argv.index("--die-after") + 1])
        threading.Timer(delay, lambda: os._exit(4)).start()
    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    print(f"listening {port} pid {os.getpid()} at {time.time()}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
