"""Default configuration of the bundled example (bidding.demo.app).

Every value can be overridden by the environment: CELERY_BROKER_URL and CELERY_RESULT_BACKEND
for Celery, BIDDING_<SETTING> for any bidding_<setting> (e.g. BIDDING_DATABASE_URL,
BIDDING_WINDOW, BIDDING_STRATEGY).
"""

import os

broker_url = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
result_backend = os.environ.get("CELERY_RESULT_BACKEND", broker_url)

# JSON only: bidding messages and results never use pickle.
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
result_accept_content = ["json"]

# Executions are acknowledged late and fetched one at a time, so a dying worker loses nothing.
worker_prefetch_multiplier = 1
task_reject_on_worker_lost = True
broker_connection_retry_on_startup = True
result_expires = 24 * 3600

# Flower sees every task, including when it was sent.
worker_send_task_events = True
task_send_sent_event = True

# celery-bidding (see README, "Configuration"); BIDDING_* environment variables win.
bidding_database_url = "sqlite:///.demo/bidding.db"
bidding_window = 2.0
bidding_strategy = "weighted"
bidding_no_bid = "fail"
