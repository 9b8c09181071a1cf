"""The AITP HTTP API (seed 004 section 8): ``create_app(celery_app)`` is a FastAPI application
that reads the store and calls the functions the ``bidding`` command calls (submit, status,
explain, nodes, stats). ``bidding api -A APP`` serves it with uvicorn."""
