"""``run --workers N``: the configuration the parent keeps for the workers it restarts.

On SIGHUP the parent reads the file as its workers do (each the file itself), so a worker restarted
later serves what its siblings serve, not the copy read at start (clients, credentials and rules
removed since were served again). What a worker's build alone checks (files, credentials,
delegation) is tried in a child (``service.workers.run_check``), as the parent holds no private key
nor credential: a file that build refuses (exit 2) is kept back, as every worker refuses it too.
A check that could not be made (the key store busy or unreadable, exit 1; the child killed or past
its limit; no child at all) says nothing against the file: it is taken, as the running workers take
it, with one line saying it was not checked. Kept back then, a worker restarted later served the
file before, with what this SIGHUP removed (it failed open).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable

from ..config import Config
from ..config.loading import reloading
from ..core.keys import KeyProvider, RevocationList
from ..errors import Error
from ..logline import exception_kind
from ..service.app import ProxyApp, restart_merge
from ..service.workers import run_check, tell_parent
from ..storage.keystore import StoreWatcher
from ..storage.storewatch import RevocationFloor
from .common import error_line

__all__ = ["RestartCopy"]

log = logging.getLogger("signing_proxy")

REFUSED = 2  # the exit status of a check whose build refused the file (``_check_build``)


class RestartCopy:
    """The parent's copy: ``accepted``, the configuration of the last SIGHUP taken (None before
    any), which a worker started from then on is built from. ``on_sighup`` runs in the parent's
    signal handler: nothing it meets is raised out of it (``run_workers`` forwards the signal)."""

    def __init__(
        self,
        config: Config,
        keys: KeyProvider,
        floor: RevocationFloor | None,
        reread: Callable[[], Config],
    ) -> None:
        self.accepted: Config | None = None
        self._config, self._keys, self._floor, self._reread = config, keys, floor, reread
        self._checking = self._again = False  # a check runs; a SIGHUP came during it

    def on_sighup(self) -> None:
        """A SIGHUP during the check (this handler, nested) is read again once the check is done."""
        self._again = True
        if self._checking:
            return
        self._checking = True
        try:
            while self._again:
                self._again = False
                try:
                    self._reconsider()
                except Exception as exc:  # a bug of ours must not stop the proxy: the type only
                    log.error(
                        "SIGHUP: the parent's work for restarted workers failed (%s)", exception_kind(exc)
                    )
        finally:
            self._checking = False

    def _reconsider(self) -> None:
        floor = self._floor
        if floor is not None:  # the store as the workers re-read it now, for those started later
            try:
                floor.check()
            except Exception as exc:  # the floor stays as it was; the tick tries again
                log.error(
                    "SIGHUP: the key store's revocations could not be re-read (%s)", exception_kind(exc)
                )
        try:
            with reloading():  # a FIFO or a device at the path is refused: this parent restarts workers
                fresh = self._reread()
        except Error:  # each worker says why, and keeps serving what ``accepted`` still holds
            return
        except Exception as exc:  # the copy stays as it was, the parent goes on; its text (and a
            # traceback's) may quote the file, a PIN in it: the type only
            log.error(
                "SIGHUP: re-reading the configuration for restarted workers failed (%s)", exception_kind(exc)
            )
            return
        config, keys, at_least = self._config, self._keys, floor.floor if floor is not None else None
        try:
            code, said = run_check(lambda: _check_build(config, fresh, keys, at_least))
        except OSError as exc:  # no child (fork: EAGAIN under a pids limit; the pipe: EMFILE)
            code, said = None, f"the check could not be started: {exception_kind(exc)}{_errno(exc)}"
        except Exception as exc:
            code, said = None, f"the check could not be started: {exception_kind(exc)}"
        if code == REFUSED:  # as every worker's build refuses it: a worker restarted later would too
            log.warning(
                "SIGHUP: a worker restarted later serves the last configuration that passed its build, "
                "not this one (%s)",
                said or "its build refused it",
            )
            return
        self.accepted = fresh
        logging.getLogger("signing_proxy").setLevel(fresh.log.level.upper())
        if code != 0:
            why = said or ("the check did not finish" if code is None else "the check could not run")
            log.warning(
                "SIGHUP: a worker restarted later serves this configuration, as the running workers "
                "do, though the parent could not check its build (%s)",
                why,
            )


def _check_build(config: Config, fresh: Config, keys: KeyProvider, floor: RevocationList | None) -> int:
    """In a child of the parent (``run_check``): 0 when a worker restarted now builds from ``fresh``
    (the key store loaded as it would load it), 2 when that build refuses it, 1 when the store cannot
    be loaded; why goes to the parent (``tell_parent``). Its own log is silent: the workers say it."""
    logging.disable(logging.CRITICAL)
    if floor is not None and isinstance(keys, StoreWatcher):
        try:
            keys.load_afresh(floor)
        except Error as exc:
            tell_parent(f"not checked: {error_line(exc)}")
            return 1
    try:
        ProxyApp(restart_merge(config, fresh)[0], keys)
    except Error as exc:
        tell_parent(error_line(exc))
        return REFUSED
    except Exception as exc:  # its text may quote a file, a PIN in it: the type only
        tell_parent(f"it could not be built ({exception_kind(exc)})")
        return REFUSED
    return 0


def _errno(exc: OSError) -> str:
    """``, EAGAIN``: the error's symbolic name (never its text, which may name a file), if known."""
    name = errno.errorcode.get(exc.errno) if exc.errno is not None else None
    return f", {name}" if name else ""
