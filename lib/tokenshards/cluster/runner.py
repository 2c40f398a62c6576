"""The one way a job runs work on the cluster.

Every job is a short script of its own steps around three calls: ``connect_to`` (a client from
the job's run options), ``submit`` (a function over work items, one task each), and
``each_result`` / ``gather`` (results as they finish, with progress, the Ctrl-C flag checked
between them, every task given up (``drop``) when anything goes wrong, and a failed task turned into one
``UserError`` line that names its item). ``each_result_as_ready`` is the same loop for items
that may not all go at once: some wait for a key (their input still arriving), some are kept in
a ``Lane`` (one machine's workers, a few at a time). ``reduce_tree`` combines results on the
workers, so only the root reaches the client. Nothing here knows what a partition, chunk, file
or download is.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence, TypeVar

from distributed import Client, Future, as_completed

from ..errors import UserError
from . import interrupt
from .connect import connect
from .machines import PathUse, check_same_view
from .options import RunOptions
from .progress import Progress

Item = TypeVar("Item")


@contextlib.contextmanager
def connect_to(options: RunOptions, *, announce: Callable[[str], None],
               local_paths: Sequence[PathUse] = ()) -> Iterator[Client]:
    """A client where ``options`` say the job runs (local, ``--scheduler``, ``--cluster``), once
    the workers on every machine were seen to share this machine's view of ``local_paths``
    (``machines.check_same_view``: one line naming the path and machines otherwise)."""
    with connect(workers=options.workers, scheduler=options.scheduler, dashboard_address=options.dashboard_address,
                 announce=announce, cluster_config=options.cluster_config) as client:
        check_same_view(client, local_paths)
        yield client


def submit(client: Client, fn: Callable, items: Sequence, *more: Sequence, retries: int = 0, **kwargs) -> list[Future]:
    """One task per item: ``fn(item, *more[i], **kwargs)``; never deduplicated (``pure=False``),
    since tasks write files."""
    return client.map(fn, list(items), *map(list, more), pure=False, retries=retries, **kwargs)


def drop(futures: Iterable[Future]) -> None:
    """Give up ``futures`` on an error path: each released, so that the scheduler forgets what no
    one else wants (tasks not yet run never run; a running one is let go).

    Not ``client.cancel``: cancelling a key cancels its dependents too, and a dependent no client
    holds any more (a tree's inner node, whose future was dropped once the next level was built;
    a finished result this client released) trips ``assert ts.who_wants`` in distributed 2026.8's
    ``Scheduler.stimulus_cancel``. The scheduler then drops this client's stream and asyncio
    prints "Task exception was never retrieved ... AssertionError" with a traceback before the
    command's one-line error."""
    for future in futures:
        future.release()


def failure(describe: Callable[[Any], str]) -> Callable[[Any, Exception], UserError]:
    """The default one-line error for a failed task: ``<what the item is> failed: <cause>``."""
    def explain(item, e: Exception) -> UserError:
        return UserError(f"{describe(item)} failed: {type(e).__name__}: {e}")

    return explain


def _result(future: Future, item, explain: Callable[[Any, Exception], UserError]):
    """A finished task's result; its ``UserError`` as it is, any other error ``explain``-ed."""
    try:
        return future.result()
    except UserError:
        raise
    except Exception as e:
        raise explain(item, e) from e


def each_result(client: Client, futures: Sequence[Future], items: Sequence[Item], *,
                explain: Callable[[Item, Exception], UserError], progress: Progress | None = None,
                amount: Callable[[Item, Any], int] = lambda item, result: 0,
                fetch: bool = True) -> Iterator[tuple[Item, Any]]:
    """(item, result) as tasks finish. A task's ``UserError`` passes through as it is; any other
    error becomes ``explain(item, error)``. On any error, Ctrl-C, or the caller leaving the loop
    early, every task still pending is cancelled. ``progress`` counts each ``amount(item, result)``.
    ``fetch=False`` leaves results on the workers (a tree of tasks combines them) and yields None."""
    item_of = {future.key: item for future, item in zip(futures, items)}
    try:
        for future in as_completed(futures):
            item = item_of[future.key]
            result = _result(future, item, explain) if fetch or future.status == "error" else None
            yield item, result
            interrupt.check()  # a Ctrl-C that Dask swallowed still stops the job here
            if progress is not None:
                progress.update(amount(item, result))
            future.release()  # a finished result is the caller's now: free it on the worker
    except BaseException:
        drop(futures)
        raise
    finally:
        if progress is not None:
            progress.close()


@dataclass(frozen=True, kw_only=True)
class Lane:
    """Tasks kept on some workers (one machine's, say): submitted there with loose restrictions, so
    that other workers take them only once all of these are gone, and at most ``slots`` at a time
    (the lane's threads), so that none waits in a worker's queue, where Dask's work stealing would
    hand it to an idle worker anywhere (distributed 2026.8 ``WorkStealing._get_thief``: a task with
    loose restrictions goes to any idle thief when none of its own workers is idle)."""

    name: str
    workers: tuple[str, ...]
    """Worker addresses, or host names / IP addresses (every worker there), as ``client.submit`` takes them."""
    slots: int

    def restrictions(self) -> dict:
        """``client.compute``/``submit`` keywords that keep a task here."""
        return {"workers": list(self.workers), "allow_other_workers": True}


def each_result_as_ready(client: Client, items: Sequence[Item], submit: Callable[[list[Item], Lane | None], list[Future]],
                         *, explain: Callable[[Item, Exception], UserError],
                         waiting_for: Callable[[Item], Hashable | None] = lambda item: None,
                         arrivals: Iterable[Hashable] = (), lane_of: Callable[[Item], Lane | None] = lambda item: None,
                         progress: Progress | None = None,
                         amount: Callable[[Item, Any], int] = lambda item, result: 0,
                         fetch: bool = True) -> Iterator[tuple[Item, Any]]:
    """``each_result`` for work whose items may not all go at once: some wait for their input to
    arrive, some are kept in a ``Lane``. ``fetch=False`` yields None for each finished item and
    leaves its result on the workers, for the futures the caller kept from ``submit``.

    ``submit(batch, lane)`` returns one future per item. An item whose ``waiting_for(item)`` is
    None is ready at once, the others when ``arrivals`` (iterated on a thread of its own: it may
    block) yields their key. Ready items go out in batches per ``lane_of(item)``: all at once for
    None (in ``growing_chunks``: the workers start on the first while the client builds the
    rest), else as the lane has free slots. An error ``arrivals`` raises stops the job like a
    failed task: raised here as it is, every task still pending cancelled. Returns once every item is
    done and ``arrivals`` is exhausted."""
    events: queue.Queue = queue.Queue()
    ready: dict[Lane | None, list] = {}
    held: dict[Hashable, list] = {}
    for item in items:
        key = waiting_for(item)
        if key is None:
            ready.setdefault(lane_of(item), []).append(item)
        else:
            held.setdefault(key, []).append(item)
    item_of: dict = {}
    lane_of_key: dict = {}
    live: dict = {}
    busy: dict[Lane, int] = {}
    first: int | None = None  # the first chunk's size, asked of the cluster once

    def chunks(batch: list, lane: Lane | None) -> Iterable[list]:
        nonlocal first
        if lane is not None:
            return [batch]
        if first is None:
            first = first_chunk(client)
        return growing_chunks(batch, first=first)

    def launch() -> None:
        for lane, waiting in ready.items():
            free = len(waiting) if lane is None else lane.slots - busy.get(lane, 0)
            batch, waiting[:] = waiting[:max(free, 0)], waiting[max(free, 0):]
            if not batch:
                continue
            if lane is not None:
                busy[lane] = busy.get(lane, 0) + len(batch)
            for chunk in chunks(batch, lane):
                for future, item in zip(submit(chunk, lane), chunk):
                    item_of[future.key], lane_of_key[future.key], live[future.key] = item, lane, future
                    future.add_done_callback(lambda f: events.put(("done", f)))  # called on another thread

    def feed() -> None:
        try:
            for key in arrivals:
                events.put(("ready", key))
        except BaseException as e:  # handed to the reading thread, raised there
            events.put(("error", e))
        else:
            events.put(("end", None))

    threading.Thread(target=feed, name="tokenshards-arrivals", daemon=True).start()
    ended = False
    try:
        launch()
        while live or not ended:
            try:
                got = [events.get(timeout=1.0)]
            except queue.Empty:
                interrupt.check()
                continue
            while True:  # everything that happened meanwhile, then one submission per lane
                try:
                    got.append(events.get_nowait())
                except queue.Empty:
                    break
            for kind, value in got:
                if kind == "error":
                    raise value
                if kind == "ready":
                    for item in held.pop(value, []):
                        ready.setdefault(lane_of(item), []).append(item)
                    continue
                if kind == "end":
                    ended = True
                    if held:
                        raise RuntimeError(f"{len(held)} inputs never arrived: {', '.join(map(str, list(held)[:3]))}")
                    continue
                future = live.pop(value.key, None)
                if future is None:
                    continue
                lane = lane_of_key.pop(future.key)
                if lane is not None:
                    busy[lane] -= 1
                item = item_of.pop(future.key)
                result = _result(future, item, explain) if fetch or future.status == "error" else None
                yield item, result
                interrupt.check()
                if progress is not None:
                    progress.update(amount(item, result))
                if fetch:
                    future.release()
            launch()
    except BaseException:
        drop(live.values())
        raise
    finally:
        if progress is not None:
            progress.close()


FIRST_CHUNK_PER_THREAD = 2
"""The first chunk of a large submission: a task running and one waiting on every worker thread."""
CHUNK_GROWTH = 4


def first_chunk(client: Client) -> int:
    """How many items the first chunk of a submission holds on this cluster (at least 8: a
    cluster still scaling up may have no workers yet)."""
    return FIRST_CHUNK_PER_THREAD * max(4, sum(client.nthreads().values()))


def growing_chunks(items: Sequence[Item], *, first: int) -> Iterator[list[Item]]:
    """``items`` in order, ``first`` of them, then chunks each ``CHUNK_GROWTH`` times the one before.

    Building and sending a partition's task costs the client ~0.34 ms (dask-expr's ``to_delayed``
    and ``compute``; 1.1 s for 3,190 partitions), which, submitted at once, the workers wait
    through before their first task: ~5.5 s at 16,000 partitions. The first chunk gives every
    worker its work at once; the later ones, a few large rather than many small, are built while
    it runs. Keeping the order across chunks is the submitter's part: Dask ranks batches sent
    within a minute of each other as one (the tokenize job gives each task its planned place as
    its priority)."""
    start, size = 0, max(first, 1)
    while start < len(items):
        yield list(items[start:start + size])
        start += size
        size *= CHUNK_GROWTH


def gather(client: Client, futures: Sequence[Future], items: Sequence[Item], *,
           explain: Callable[[Item, Exception], UserError], progress: Progress | None = None,
           amount: Callable[[Item, Any], int] = lambda item, result: 0) -> list:
    """Every result, in the order of ``items`` (for steps whose results are all small)."""
    results: list = [None] * len(items)
    for i, result in each_result(client, futures, range(len(items)), explain=lambda i, e: explain(items[i], e),
                                 progress=progress, amount=lambda i, result: amount(items[i], result)):
        results[i] = result
    return results


def reduce_tree(client: Client, leaves: Sequence[Future], combine: Callable, *, fan_in: int = 8,
                root_kwargs: dict | None = None, retries: int = 0, **kwargs) -> Future:
    """Combine ``leaves`` ``fan_in`` at a time on the workers, level by level; the root is one
    more ``combine`` call (with ``root_kwargs`` besides ``kwargs``), so only it reaches the client."""
    level = list(leaves)
    while len(level) > fan_in:
        level = [client.submit(combine, *level[i:i + fan_in], pure=False, retries=retries, **kwargs)
                 for i in range(0, len(level), fan_in)]
    return client.submit(combine, *level, pure=False, retries=retries, **kwargs, **(root_kwargs or {}))


def result_of(client: Client, future: Future, *, explain: Callable[[Exception], UserError],
              also_cancel: Sequence[Future] = ()) -> Any:
    """One future's result (a tree's root); any error is ``explain``-ed and gives up ``also_cancel``
    too (``drop``: released, never ``client.cancel``-ed, which trips an assertion in distributed's
    scheduler for a tree whose inner nodes no client holds)."""
    try:
        return future.result()
    except UserError:
        drop([future, *also_cancel])
        raise
    except BaseException as e:
        drop([future, *also_cancel])
        if not isinstance(e, Exception):  # Ctrl-C: as it is
            raise
        raise explain(e) from e
