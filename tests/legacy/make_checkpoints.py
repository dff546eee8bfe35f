"""Write this release's legacy checkpoints (run once per release, with each supported Lightning; commit the files).

``python tests/legacy/make_checkpoints.py`` adds
``tests/legacy/checkpoints/<package>-lightning-<lightning>-<case>.ckpt`` and records it in
``tests/legacy/checkpoints/manifest.json``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from frozen import CASES, L, train

import lightning_midepoch

HERE = Path(__file__).resolve().parent / "checkpoints"


def main() -> None:
    HERE.mkdir(exist_ok=True)
    manifest_path = HERE / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else []
    for case in CASES:
        name = f"{lightning_midepoch.__version__}-lightning-{L.__version__}-{case}.ckpt"
        with tempfile.TemporaryDirectory() as root:
            model = train(case, Path(root), save_to=HERE / name)
        entry = {
            "file": name,
            "case": case,
            "batches_before": len(model.seen),
            "package_version": lightning_midepoch.__version__,
            "lightning_version": L.__version__,
        }
        manifest = [e for e in manifest if e["file"] != name] + [entry]
        print(f"wrote {name} ({(HERE / name).stat().st_size} bytes)")
    manifest_path.write_text(json.dumps(sorted(manifest, key=lambda e: e["file"]), indent=2) + "\n")


if __name__ == "__main__":
    main()
