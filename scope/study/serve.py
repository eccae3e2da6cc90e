"""Start the study server from its config: check everything before binding, then serve."""
from __future__ import annotations

import os
import sys

from sqlalchemy.exc import SQLAlchemyError

from ..config import ConfigError
from ..models.server import LOOPBACK, Server
from .agents import TaskBank, build_agents
from .app import make_app
from .config import StudyConfig, load_study
from .service import StudyService
from .store import make_engine


def build(cfg: StudyConfig, secret: bytes, admin_token: str | None = None):
    """The app of a study (agents loaded, tasks checked, database ready)."""
    agents = build_agents(cfg)
    bank = TaskBank(cfg, agents)
    engine = make_engine(cfg.database_url())
    return make_app(StudyService(cfg, engine, agents, bank, secret), admin_token=admin_token)


def serve(config: str, host: str | None = None, port: int | None = None) -> int:
    try:
        cfg = load_study(config)
        secret = os.environ.get(cfg.study.secret_env)
        if not secret or len(secret) < 16:
            raise ConfigError(f"set {cfg.study.secret_env} to a secret of at least 16 characters (it signs "
                              "session tokens and completion codes; keep it for the whole study)")
        admin = os.environ.get(cfg.study.admin_token_env) or None
        app = build(cfg, secret.encode(), admin)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SQLAlchemyError as e:
        cause = getattr(e, "orig", None) or e  # only DBAPI errors carry the driver's own (orig)
        print(f"error: study database {cfg.database_url()}: {type(cause).__name__}: {cause}",
              file=sys.stderr)
        return 2
    host = host or cfg.study.host
    srv = Server(app, host, cfg.study.port if port is None else port)
    srv.start()
    h, p = srv.server_address
    print(f"study {cfg.study.id}: http://{h}:{p}/?PROLIFIC_PID={{id}}&STUDY_ID={{study}}&SESSION_ID={{session}} "
          f"({len(cfg.conditions)} conditions x {len(cfg.tasks)} task types; database {cfg.database_url()})"
          + ("" if admin else f"; admin endpoints off ({cfg.study.admin_token_env} not set)")
          + ("" if host in LOOPBACK else "; listening beyond loopback"), flush=True)
    srv.wait()
    return 0
