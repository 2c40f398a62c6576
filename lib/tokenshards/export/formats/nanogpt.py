"""``nanogpt``: nanoGPT's ``train.bin`` / ``val.bin``: raw uint16, its ``np.memmap`` dtype."""
from __future__ import annotations

from ...errors import UserError
from ..layout import OutFile, Streams, TokenRun
from .base import Format, Plan, wide


class NanoGPT(Format):
    name = "nanogpt"
    reader = "nanoGPT"
    help = "nanoGPT train.bin/val.bin (raw uint16)"
    card = "nanoGPT's `train.bin` / `val.bin`: raw tokens, read with `np.memmap`"
    fixed_names = "nanoGPT's train.py reads the fixed names train.bin and val.bin"

    def dtype(self, source_dtype: str) -> str:
        if wide(source_dtype):
            raise UserError("nanoGPT's train.py reads train.bin/val.bin as uint16, but this output's encoding needs "
                            "uint32 ids; export --format llmc (llama-3 layout), npy or megatron instead")
        return "<u2"

    def files(self, streams: Streams, plan: Plan) -> list[OutFile]:
        return [OutFile(name=f"{split}.bin", split=split, tokens=streams.tokens(split),
                        regions=(TokenRun(split, 0, streams.tokens(split), plan.dtype),))
                for split in ("train", "val") if streams.tokens(split)]

    def patterns(self, prefix: str) -> list[str]:
        return ["train.bin", "val.bin"]

    def record_name(self, prefix: str) -> str:
        return "export.json"


FORMAT = NanoGPT()
