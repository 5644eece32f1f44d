"""Grafana dashboards and Prometheus rules for neuron-exporter, built from code (see build.py)."""
