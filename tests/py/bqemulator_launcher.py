"""Starts bqemulator (PyPI `bqemulator`) without its DuckDB spatial extension.

bqemulator downloads DuckDB's `spatial` extension at start and exits when it cannot (no network
beyond the package registries here). Skipping it leaves GEOGRAPHY unsupported; everything else
works. Arguments are bqemulator's own, e.g.
`start --rest-host 127.0.0.1 --rest-port 9050 --grpc-host 127.0.0.1 --grpc-port 9060 --project p`.
"""
import sys

import bqemulator.storage.engine as engine

engine.DuckDBEngine._load_spatial = lambda self: None

from bqemulator.cli import main  # noqa: E402  (after the patch)

sys.exit(main())
