"""Variants: the device a page is rendered as, modelled on Googlebot's two crawlers.

Why this module exists: Google indexes mobile-first, with a smartphone crawler (a Nexus 5X:
412 × 732 CSS pixels at 2.625 device pixels each, touch, a mobile User-Agent), and keeps a
desktop one. A site that sniffs the User-Agent, lays out by viewport width or asks
``matchMedia('(pointer: coarse)')`` serves the two different documents; a snapshot rendered one
way is not what the other crawler sees. A variant sets everything a page can read of its
device, through DevTools' ``Emulation`` domain on the page's own target:

* the viewport, device scale and mobile flag (``setDeviceMetricsOverride``: a mobile viewport
  also gets the meta-viewport handling and overlay scrollbars of a phone);
* touch (``setTouchEmulationEnabled``: ``navigator.maxTouchPoints``, ``pointer: coarse``,
  ``hover: none``);
* the User-Agent and its client hints (``setUserAgentOverride``): Chromium's own product token
  and version in Googlebot's form for that device, never Googlebot's name (a render that posed
  as Googlebot would be sent to the prerenderer again, a loop, and would tell the site a lie),
  with the render's mark (``page.RENDER_MARK``) appended.

A route names its variants (``variants = ["mobile"]``); a route that names none renders as it
always did, as Chromium itself (no emulation at all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, final


@final
@dataclass(frozen=True)
class Variant:
    """One device to render as."""

    name: str
    width: int
    height: int
    scale: float
    mobile: bool
    touch: bool
    agent: str
    """The User-Agent, with ``{product}`` for Chromium's own ``HeadlessChrome/VERSION``."""
    platform: str
    """``navigator.platform``."""
    hints: tuple[tuple[str, Any], ...] = ()
    """User-Agent client hints (CDP ``UserAgentMetadata`` without brands); (): Chromium's."""

    def user_agent(self, browsers: str, mark: str) -> str:
        """This device's User-Agent for a browser whose own is ``browsers``, marked."""
        m = re.search(r"\b(?:Headless)?Chrome/[0-9.]+", browsers)
        product = m.group(0) if m else "Chrome"
        return f"{self.agent.format(product=product)} {mark}"

    def emulation(self, user_agent: str) -> list[tuple[str, dict[str, Any]]]:
        """The ``Emulation`` calls that make a page's target this device."""
        agent: dict[str, Any] = {"userAgent": user_agent, "platform": self.platform}
        if self.hints:
            agent["userAgentMetadata"] = dict(self.hints)
        return [
            ("Emulation.setDeviceMetricsOverride", {
                "width": self.width, "height": self.height, "deviceScaleFactor": self.scale,
                "mobile": self.mobile, "screenWidth": self.width,
                "screenHeight": self.height}),
            ("Emulation.setTouchEmulationEnabled", {"enabled": self.touch,
                                                    **({"maxTouchPoints": 5} if self.touch
                                                       else {})}),
            ("Emulation.setUserAgentOverride", agent)]


VARIANTS: Final = {
    # Googlebot Smartphone: "Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P)
    # AppleWebKit/537.36 (KHTML, like Gecko) Chrome/W.X.Y.Z Mobile Safari/537.36 (compatible;
    # Googlebot/2.1; +http://www.google.com/bot.html)", on a Nexus 5X's screen.
    "mobile": Variant("mobile", 412, 732, 2.625, True, True,
                      "Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P)"
                      " AppleWebKit/537.36 (KHTML, like Gecko) {product} Mobile Safari/537.36",
                      "Linux armv8l",
                      (("platform", "Android"), ("platformVersion", "6.0.1"),
                       ("architecture", ""), ("model", "Nexus 5X"), ("mobile", True))),
    # Googlebot Desktop: a Chrome on a desktop (Chromium's own Linux User-Agent), 1024 px wide.
    "desktop": Variant("desktop", 1024, 1024, 1.0, False, False,
                       "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)"
                       " {product} Safari/537.36", "Linux x86_64"),
}
"""What each of the names a route may give (``engine.corpus.rules.VARIANT_NAMES``) renders as."""
