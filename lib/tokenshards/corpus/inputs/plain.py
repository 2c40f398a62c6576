"""Plain inputs: parquet files fsspec opens wherever a task runs (local paths on a shared disk,
``s3://``, ``hf://``). Listed on the client (``storage.sources``); their footers are read on the
workers, so the client never opens a data file."""
from __future__ import annotations

from distributed import Client

from ...cluster import runner
from ...errors import UserError
from ...storage.sources import ListedInput
from ..plan import BadInput, InputFile, read_input_or_bad
from ...wording import brief
from .base import FooterRequest, Inputs


class PlainInputs(Inputs):
    def __init__(self, sources: list[ListedInput]):
        self._sources = list(sources)

    def sources(self) -> list[ListedInput]:
        return list(self._sources)

    def footers(self, client: Client, request: FooterRequest) -> list[InputFile | BadInput]:
        return read_footers(client, self._sources, request)


def read_footers(client: Client, sources: list[ListedInput], request: FooterRequest) -> list[InputFile | BadInput]:
    """Every source's footer, read by the workers, in the order of ``sources``."""
    if not sources:
        return []
    futures = runner.submit(client, read_input_or_bad, [s.url for s in sources], [s.name for s in sources],
                            on_bad_file=request.on_bad_file, text_column=request.text_column,
                            id_column=request.id_column, storage_options=request.storage_options, chat=request.chat)
    return runner.gather(client, futures, sources, explain=_unreachable_input)


def _unreachable_input(source: ListedInput, e: Exception) -> UserError:
    """botocore's own errors on a worker: no credentials there, no route to the store."""
    return UserError(f"{source.url}: a worker could not read it ({type(e).__name__}: {brief(e)}); "
                     "check that every worker has credentials and network access to the inputs")
