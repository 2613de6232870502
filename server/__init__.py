"""The wiring at the top of the layers: what a web server serves (urls.py, asgi.py)."""
