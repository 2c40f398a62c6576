"""Footers of Hub files read on the client by ranged GETs (a few at a time), before any
download of them: planned as ``InputFile``s of the url tasks will open, with the identity the
file will have there."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ...storage.hub.footer import read_footer
from ...storage.hub.listing import HubFile, HubListing
from ...storage.hubspec import HubDataset
from ..plan import BadInput, InputFile, footer_or_bad
from .base import FooterRequest

AT_ONCE = 8
"""Footer requests in flight: each is one small GET, so latency, not bandwidth, is what they wait on."""


def ranged_footers(ds: HubDataset, listing: HubListing, files: dict[str, HubFile], request: FooterRequest, *,
                   identity: Callable[[HubFile], tuple]) -> list[InputFile | BadInput]:
    """``files`` (url → Hub file) planned from their footers on the Hub, in the order given."""
    def one(item: tuple[str, HubFile]) -> InputFile | BadInput:
        url, f = item
        return footer_or_bad(url, f.path, lambda: (identity(f), read_footer(ds, listing, f)),
                             on_bad_file=request.on_bad_file, text_column=request.text_column,
                             id_column=request.id_column, chat=request.chat)

    if not files:
        return []
    with ThreadPoolExecutor(max_workers=min(AT_ONCE, len(files))) as pool:
        return list(pool.map(one, files.items()))
