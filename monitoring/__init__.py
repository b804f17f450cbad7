"""Monitoring as code: Prometheus configuration and rules, Grafana dashboards (issue 9)."""
