"""The example Celery app: configured from ``celeryconfig`` (or $BIDDING_DEMO_CONFIG)."""

import os

from celery import Celery

import bidding

app = Celery("bidding_demo", include=["bidding.demo.tasks"])
app.config_from_object(os.environ.get("BIDDING_DEMO_CONFIG", "celeryconfig"))
bidding.install(app)
