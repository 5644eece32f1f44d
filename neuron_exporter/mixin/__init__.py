"""The monitoring mixin of neuron-exporter: the Grafana dashboards (dashboards/) and the Prometheus rules (rules/)
built from code and one configuration (config.py); build.py turns them into files (``python -m
neuron_exporter.mixin``, ``make dashboards``), which are committed at the repository's root, in dashboards/ and
deploy/prometheus/rules/. The dashboards need the Grafana SDK (the ``dashboards`` extra); the configuration and
the rules do not."""
