# Type stubs for the part of cloudpickle (3.x) the modelmux package uses: cloudpickle ships no
# type hints and typeshed has no stubs for it. Its signatures are pickle's (cloudpickle.load is
# pickle.load; dumps and Pickler take pickle's protocol and buffer_callback).
import pickle
from collections import ChainMap
from collections.abc import Callable
from pickle import load as load
from typing import Any

class Pickler(pickle.Pickler):
    # cloudpickle's reducers before copyreg's (a live view of both).
    dispatch_table: ChainMap[type, Callable[[Any], Any]]
    def __init__(
        self,
        file: Any,
        protocol: int | None = None,
        buffer_callback: Callable[[pickle.PickleBuffer], Any] | None = None,
    ) -> None: ...

def dumps(
    obj: Any,
    protocol: int | None = None,
    buffer_callback: Callable[[pickle.PickleBuffer], Any] | None = None,
) -> bytes: ...

