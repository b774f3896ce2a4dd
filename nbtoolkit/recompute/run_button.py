"""The optimize panel's run button: disabled in the page the moment it is clicked.

An ipywidgets Button is disabled only when the kernel's reply arrives, so a double click
sends two clicks. This anywidget disables itself in the browser on the click, shows the
seconds since (a long compile does not look like a frozen page), and enables itself again
when the kernel says the run ended (``finished`` counts runs, so every end is a change).

A click message carries the ``finished`` count the page had seen: the kernel runs it only if
no run ended since (:meth:`RunButton.accepts`), so a click queued behind a running
measurement (two views of one panel, a message delivered late) does not start a second one.
The front end is small and lives here, inline: the recompute feature does not reach into the
timeline feature's widget assets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anywidget
import traitlets

__all__ = ["RunButton"]

_ESM = """
function render({ model, el }) {
  const button = document.createElement("button");
  button.className = "jupyter-widgets jupyter-button widget-button mod-primary nbt-run-button";
  const clock = document.createElement("span");
  clock.className = "nbt-run-clock";
  clock.style.marginLeft = "0.5em";
  let waiting = false;   // clicked here, the kernel has not ended the run yet
  let timer = null;
  let started = 0;
  const tick = () => { clock.textContent = Math.round((Date.now() - started) / 1000) + " s"; };
  const show = () => {
    const busy = waiting || model.get("busy");
    button.disabled = busy || model.get("disabled");
    button.textContent = busy ? model.get("busy_label") : model.get("label");
    if (busy && timer === null) { started = Date.now(); tick(); timer = setInterval(tick, 500); }
    if (!busy && timer !== null) { clearInterval(timer); timer = null; clock.textContent = ""; }
  };
  button.addEventListener("click", () => {
    if (button.disabled) return;
    waiting = true;
    show();  // disabled now, before the kernel hears of the click
    model.send({ event: "run", seen: model.get("finished") });
  });
  model.on("change:finished", () => { waiting = false; show(); });
  model.on("change:busy", show);
  model.on("change:disabled", show);
  model.on("change:label", show);
  el.append(button, clock);
  show();
  return () => { if (timer !== null) clearInterval(timer); };
}
export default { render };
"""


class RunButton(anywidget.AnyWidget):
    """``label``; ``busy`` (a run is queued or running); ``disabled`` (nothing can run now);
    ``finished`` (runs ended so far). ``on_run(callback)`` is called with no argument per accepted click."""

    _esm = _ESM
    label = traitlets.Unicode("Apply and measure").tag(sync=True)
    busy_label = traitlets.Unicode("Measuring…").tag(sync=True)
    busy = traitlets.Bool(False).tag(sync=True)
    disabled = traitlets.Bool(False).tag(sync=True)
    finished = traitlets.Int(0).tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._callbacks: list[Callable[[], None]] = []
        self.on_msg(self._on_message)

    def on_run(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def accepts(self, seen: Any) -> bool:
        """A click made when the page had seen ``seen`` runs end: run it only if none ended since."""
        return isinstance(seen, int) and not isinstance(seen, bool) and seen == self.finished

    def click(self) -> None:
        """A click from Python (tests, scripts): as the page's, made now."""
        self._on_message(self, {"event": "run", "seen": self.finished}, [])

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict) or content.get("event") != "run":
            return
        if self.busy or self.disabled or not self.accepts(content.get("seen")):
            # the page disabled itself on the click; this one is late or doubled: tell its view
            # the state again (a change of ``finished`` re-enables a view that still waits)
            if not self.busy:
                self.finished += 1
            return
        for callback in self._callbacks:
            callback()

    def end_run(self) -> None:
        """The run ended (done, failed or refused): every view enables its button again."""
        self.busy = False
        self.finished += 1
