"""How long does the web calculator's serving view (POST /api/simulate) take per call?

Run: python benchmarks/bench_serving_view.py
Posts each body below through FastAPI's TestClient (the app in-process, no network) 3 times after one warm-up call,
and prints the best and median wall time of the call, the engine steps it simulated against the budget, and the
requests per level it chose. The budget (`speedlimit.web.serving.STEP_BUDGET`, `TOKEN_BUDGET`) is what keeps a call
near a second; this measures what that is on the machine at hand.
"""

from __future__ import annotations

import platform
import statistics
import time

BASE = {"model": "llama-3.1-8b", "hardware": "h100-sxm"}
BODIES = {
    "page defaults (prompt 512, output 1,000, concurrency 1-512)": {"prompt": 512, "output": 1000},
    "rate, default levels around saturation": {"prompt": 512, "output": 1000, "load": "rate"},
    "serial engine, concurrency 1-2": {"prompt": 512, "output": 1000, "engine": "serial"},
    "serial engine, rate": {"prompt": 512, "output": 1000, "engine": "serial", "load": "rate"},
    "prompt 512, output 128, SLO": {"prompt": 512, "output": 128, "slo": "ttft=200ms,tpot=20ms"},
    "70B TP 4, prompt 8,000, output 4,000": {"model": "llama-3.1-70b", "tp": 4, "prompt": 8000, "output": 4000},
}


def main() -> None:
    from fastapi.testclient import TestClient

    import speedlimit
    from speedlimit.web import serving
    from speedlimit.web.app import create_app

    print(f"speedlimit {speedlimit.__version__}, Python {platform.python_version()}, {platform.machine()}; "
          f"budget {serving.STEP_BUDGET:,} steps, {serving.TOKEN_BUDGET:,} generated tokens per call")
    client = TestClient(create_app())
    for label, body in BODIES.items():
        times = []
        data = None
        for attempt in range(4):
            start = time.perf_counter()
            response = client.post("/api/simulate", json={**BASE, **body})
            elapsed = time.perf_counter() - start
            if response.status_code != 200:
                print(f"{label}: {response.status_code} {response.json()['detail']}")
                break
            data = response.json()
            if attempt:
                times.append(elapsed)
        if not times:
            continue
        work = data["work"]
        print(f"{label}: best {min(times):.3f} s, median {statistics.median(times):.3f} s of 3; "
              f"{len(data['points'])} levels × {data['requests_per_level']} requests, {work['steps']:,} steps "
              f"(planned {work['planned_steps']:,})")


if __name__ == "__main__":
    main()
