"""The Celery app of the tour, with bidding installed: its tasks are auctioned among the nodes.

Settings come from the environment, with defaults that fit the tour:

- CELERY_BROKER_URL: redis://127.0.0.1:6479/0, where ``bidding redis --port 6479`` listens;
- CELERY_RESULT_BACKEND: the broker;
- BIDDING_DATABASE_URL (or any other BIDDING_<SETTING>): tour.db in the tour's folder.
"""

import os
from pathlib import Path

from celery import Celery

import bidding

BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6479/0")
#: examples/tour/, wherever the commands are run from.
TOUR_DIR = Path(__file__).resolve().parent.parent

app = Celery("proj", include=["proj.tasks"])
app.conf.update(
    # JSON only, late acks with prefetch 1, broker retries at start-up: what bidding needs.
    bidding.celery_conf(BROKER_URL, os.environ.get("CELERY_RESULT_BACKEND")),
    # Flower sees every task, including when it was sent.
    worker_send_task_events=True,
    task_send_sent_event=True,
    # An absolute path, so every command finds the same store whatever folder it runs from
    # (a relative sqlite:///tour.db would be a new, empty store in each folder).
    bidding_database_url=f"sqlite:///{TOUR_DIR / 'tour.db'}",
)
bidding.install(app)
