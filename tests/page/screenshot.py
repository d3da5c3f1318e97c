"""Take the live page's screenshot for the docs: the demo, watched for a while in headless Chromium.

    python -m tests.page.screenshot --out docs/img/live-page.png      # from the repository root

(OMP_NUM_THREADS=1 and the demo's default model, as docs/grafana.md says.)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tests.monitoring.promstack import Proc, free_port, temp_dir, wait_until

from ._browser import browser

HEIGHT_JS = "Math.ceil(document.querySelector('footer').getBoundingClientRect().bottom) + 8"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--seconds", type=float, default=90, help="how long the page watches the demo first")
    p.add_argument("--window", type=int, default=30, help="the page's window, seconds")
    p.add_argument("--width", type=int, default=1440)
    args = p.parse_args(argv)
    port = free_port()
    with temp_dir() as work:
        demo = Proc("demo", [sys.executable, "-m", "gpuprobe", "demo", "--port", str(port), "--requests", "100000",
                             "--plot", ""], os.path.join(work, "demo.log"))
        try:
            wait_until("the demo", lambda: "live page at" in demo.log_tail(), 300, (demo,))
            with browser(args.width, 1000) as b:
                b.send("Page.navigate", {"url": f"http://127.0.0.1:{port}/#window={args.window}"})
                time.sleep(args.seconds)
                demo.check_alive()
                b.screenshot(args.out, args.width, int(b.evaluate(HEIGHT_JS)))
        finally:
            demo.stop()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
