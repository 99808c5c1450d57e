"""Two-phase commit through the mirror: a prepared transaction becomes visible in
Iceberg at COMMIT PREPARED, not at PREPARE, and a rolled-back one never does.

    python examples/two_phase.py --config examples/quickstart.toml

Needs a publisher with ``max_prepared_transactions > 0`` and the config's publication
publishing ``public.accounts`` (created here if missing, with the publication). Runs
sparkapply in this process (``--until-caught-up`` after each step) and reads the
mirror with pyiceberg after each step.
"""

from __future__ import annotations

import argparse

import psycopg
from _catalog import open_catalog
from psycopg import sql

from sparkapply.config import load_config
from sparkapply.run.subscriber import Subscriber


def balances(config_path: str) -> dict[int, int]:
    arrow = open_catalog(config_path).load_table(("public", "accounts")).scan().to_arrow()
    return dict(zip(arrow["id"].to_pylist(), arrow["balance"].to_pylist(), strict=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the sparkapply config file")
    args = p.parse_args()
    config = load_config(args.config)
    dsn = config.source.dsn
    publication = config.source.publication[0]
    sub = Subscriber(config)

    def mirror(step: str) -> None:
        sub.run(until_caught_up=True)
        print(f"{step:<44} iceberg: {balances(args.config)}")

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, balance int NOT NULL)"
        )
        conn.execute("INSERT INTO accounts VALUES (1, 100), (2, 100) ON CONFLICT DO NOTHING")
        exists = conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)
        ).fetchone()
        if not exists:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE accounts").format(
                    sql.Identifier(publication)
                )
            )
    mirror("initial copy")

    with psycopg.connect(dsn, autocommit=True) as conn:
        # A coordinator's transfer: prepared on this node, decided later.
        conn.execute("BEGIN")
        conn.execute("UPDATE accounts SET balance = balance - 30 WHERE id = 1")
        conn.execute("UPDATE accounts SET balance = balance + 30 WHERE id = 2")
        conn.execute("PREPARE TRANSACTION 'transfer-1'")
        mirror("PREPARE TRANSACTION 'transfer-1'")  # staged durably, not visible

        conn.execute("COMMIT PREPARED 'transfer-1'")
        mirror("COMMIT PREPARED 'transfer-1'")  # now visible, atomically

        conn.execute("BEGIN")
        conn.execute("UPDATE accounts SET balance = 0")
        conn.execute("PREPARE TRANSACTION 'transfer-2'")
        conn.execute("ROLLBACK PREPARED 'transfer-2'")
        mirror("PREPARE + ROLLBACK PREPARED 'transfer-2'")  # never visible
    sub.stop()


if __name__ == "__main__":
    main()
