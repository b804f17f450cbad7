"""Grafana dashboards as code, built with Grafana's foundation SDK; the JSON is committed.

    python -m monitoring.grafana           # rewrite monitoring/grafana/dashboards/*.json
    python -m monitoring.grafana --check   # exit 1 when the committed JSON differs

One module per dashboard (engine.py, gateway.py, capacity.py), the shared panel helpers in
common.py, the planner's predictions in plans.py. provisioning/ holds Grafana's data source and
dashboard provider files.
"""
