"""The web dashboard: HTML pages at /ui, rendered on the server from what `Admin` reads (Jinja2), with a little
script for live numbers and charts; every asset ships in the package (ADR 0017, docs/dashboard.md)."""
