"""Alembic environment: runs on the connection handed over by bidding.store.migrate."""

from alembic import context
from sqlalchemy import create_engine

from bidding.store.schema import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url")
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    assert url, "set sqlalchemy.url or pass a connection"
    from bidding.store.engine import pooler_connect_args

    engine = create_engine(url, connect_args=pooler_connect_args(url))
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()


run()
