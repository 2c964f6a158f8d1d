"""Print the uncertain terms (devices.uncertainty) as the markdown table of
docs/devices.md ("Uncertain terms"): key, meaning, unit, documented range, the nominal
the catalog runs, the sweep spacing and the sources.

    python scripts/uncertain_terms_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.uncertainty import uncertain_terms  # noqa: E402


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def main() -> None:
    print("| key | what it is | unit | low | nominal | high | sweep | sources |")
    print("|---|---|---|---|---|---|---|---|")
    for t in uncertain_terms():
        print(f"| `{t.key}` | {cell(t.doc)} | {t.unit or '-'} | {t.low:g} | {t.nominal:.4g} | {t.high:g} | "
              f"{t.scale} | {cell('; '.join(t.sources))} |")


if __name__ == "__main__":
    main()
