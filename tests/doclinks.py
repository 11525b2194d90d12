"""Links and headings of a Markdown text, read by rendering it (Python-Markdown, as MkDocs renders
the site), not by a pattern of our own: what a reader can click is what is checked."""

from __future__ import annotations

import html.parser
import re

import markdown

EXTENSIONS = ["tables", "fenced_code", "toc"]
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def github_slug(text: str, separator: str = "-") -> str:
    """A heading's anchor as the repository host makes it: lower case, punctuation dropped, each
    space a hyphen (not collapsed)."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", separator)


class _Collector(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and "href" in attrs:
            self.links.append(attrs["href"])
        if tag == "img" and "src" in attrs:
            self.links.append(attrs["src"])
        if tag in ("h1", "h2", "h3", "h4", "h5", "h6") and "id" in attrs:
            self.ids.add(attrs["id"])


def read(text: str) -> _Collector:
    """Every link target (a href, img src) of a Markdown text, and its headings' anchors."""
    collector = _Collector()
    collector.feed(markdown.markdown(text, extensions=EXTENSIONS,
                                     extension_configs={"toc": {"slugify": github_slug}}))
    return collector


def is_relative(target: str) -> bool:
    return not SCHEME.match(target) and not target.startswith("//")
