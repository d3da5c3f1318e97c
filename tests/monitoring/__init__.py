"""Monitoring integrations: dashboards, Prometheus rules and scrape configs, checked against a real Prometheus."""
