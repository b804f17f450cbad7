"""A small client for Prometheus' HTTP API (instant and range queries, metric names).

    api = PrometheusAPI("http://127.0.0.1:9090")
    api.ready()                                        # /-/ready answers 200
    api.query('sum by (job) (up)')                     # [Series(labels={"job": ...}, ...)]
    api.query_range("rate(x_total[1m])", start, end, step=1)
    api.names()                                        # every metric name it holds

Used by the live monitoring test and by `python -m monitoring.snapshot`; standard library
only. A failed query (bad PromQL, an HTTP error) raises PrometheusError with Prometheus' own
message; NaN and ±Inf values become None (Grafana leaves a gap there too).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any


class PrometheusError(RuntimeError):
    pass


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float | None]]
    """(unix time, value); one point for an instant query."""

    @property
    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None


def _number(text: str) -> float | None:
    value = float(text)
    return None if math.isnan(value) or math.isinf(value) else value


class PrometheusAPI:
    def __init__(self, base_url: str, *, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        url = f"{self.base_url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:  # 400/422/503 carry Prometheus' error JSON
            try:
                body = json.load(exc)
            except ValueError:
                raise PrometheusError(f"GET {url}: HTTP {exc.code}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')} ({url})")
        return body["data"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        kind, result = data["resultType"], data["result"]
        if kind == "vector":
            return [
                Series(item["metric"], [(float(item["value"][0]), _number(item["value"][1]))])
                for item in result
            ]
        if kind == "matrix":
            return [
                Series(item["metric"], [(float(t), _number(v)) for t, v in item["values"]])
                for item in result
            ]
        if kind == "scalar":
            return [Series({}, [(float(result[0]), _number(result[1]))])]
        raise PrometheusError(f"unexpected result type {kind} for {expr}")

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = self._get("/api/v1/query_range", params)
        return [
            Series(item["metric"], [(float(t), _number(v)) for t, v in item["values"]])
            for item in data["result"]
        ]

    def names(self) -> set[str]:
        """Every metric name in the TSDB (scraped and recorded)."""
        return set(self._get("/api/v1/label/__name__/values"))

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self._get("/api/v1/targets")["activeTargets"]
        return active
