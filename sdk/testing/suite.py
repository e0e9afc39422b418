"""``BackendTests``: every group of the kit in one base class."""

from __future__ import annotations

from .capacity import CapacityTests
from .concurrency import ConcurrencyTests
from .corruption import CorruptionTests
from .crash import CrashSafetyTests
from .deadlines import DeadlinesTests
from .expire import ExpireTests
from .framed import FramedTests
from .instances import InstanceTests
from .keep import KeepTests
from .lifecycle import LifecycleTests
from .lookup_evict import EvictTests, LookupTests
from .persistence import PersistenceTests
from .put_get import PutGetTests
from .recency import RecencyTests
from .scan import ScanTests
from .shared import SharedTests
from .stateful import StatefulTests

__all__ = ["BackendTests"]


class BackendTests(
    PutGetTests,
    LookupTests,
    EvictTests,
    CapacityTests,
    RecencyTests,
    PersistenceTests,
    SharedTests,
    ConcurrencyTests,
    CrashSafetyTests,
    CorruptionTests,
    StatefulTests,
    LifecycleTests,
    InstanceTests,
    ScanTests,
    KeepTests,
    ExpireTests,
    DeadlinesTests,
    FramedTests,
):
    """The conformance kit: subclass it as ``Test...`` in a test module.

    Set ``backend`` to an entry-point name or an import path
    (``"my_pkg.backend:MyBackend"``) and override the ``backend_options``
    fixture.  Groups whose capability the backend does not declare skip with
    the reason.  See ``docs/writing-a-backend.md``.

    Example::

        class TestMyBackend(BackendTests):
            backend = "my-backend"

            @pytest.fixture
            def backend_options(self, tmp_path):
                return {"path": str(tmp_path), "capacity": "16MiB"}
    """
