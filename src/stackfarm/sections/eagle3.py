"""20-eagle3: the derived contract (``contract``, ``contract_diff``, ``verdict_diff``) and each class against it
(testcases carrying ``model_class`` and ``method``), with the provider's and the consumer's ``file:line``."""

from __future__ import annotations

from . import Context, register
from .html import e, findings

KEYS = ("role", "model_class", "method", "verdict", "provider_file", "consumer_site", "detail")
TEXTS = (
    ("contract", "Derived contract"),
    ("contract_diff", "Contract diff"),
    ("verdict_diff", "Verdict changes"),
)


@register("eagle3", name="eagle3", order=20)
def render(ctx: Context) -> str:
    texts: list[str] = []
    for suite in ctx.suites:
        for case in suite.cases:
            for key, title in TEXTS:
                if key in case.properties:
                    version = case.properties.get("sglang") or case.properties.get("compared_with") or ""
                    label = f"{title} (sglang {version})" if version and key == "contract" else title
                    texts.append(f"<h3>{e(label)}</h3><pre>{e(case.properties[key])}</pre>")
    cases = [
        (s.result.suite, c)
        for s in ctx.suites
        for c in s.cases
        if {"model_class", "method"} <= c.properties.keys()
    ]
    if not texts and not cases:
        return ""
    out = "<h2>EAGLE-3 contract</h2>" + "".join(texts)
    if cases:
        out += findings(
            "Classes against the contract", cases, KEYS, locations=("provider_file", "consumer_site")
        )
    return out
