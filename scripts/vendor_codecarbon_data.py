"""Copies the data tchtrain's CodeCarbon tracker estimates with (callbacks/src/codecarbon_data.rs)
from the installed codecarbon (3.3.2, MIT license) into callbacks/data/codecarbon/, and writes
countries.json from pycountry (ISO 3166-1: alpha-2 -> [alpha-3, name], what codecarbon's backup
location lookup converts with).

The reference scripts/reference/codecarbon_callback.py records the same files' sha256 and
pycountry's table; callbacks/tests/it/codecarbon.rs checks the copies against them.

Usage: python scripts/vendor_codecarbon_data.py   (with the setup venv's Python)
"""

import json
import shutil
from pathlib import Path

import codecarbon
import pycountry

FILES = ["hardware/cpu_power.csv", "private_infra/global_energy_mix.json",
         "private_infra/carbon_intensity_per_source.json", "private_infra/nordic_emissions.json",
         "private_infra/2023/usa_emissions.json", "private_infra/2023/canada_energy_mix.json",
         "private_infra/2023/china_provincial_emissions.json", "cloud/impact.csv"]


def countries():
    return {c.alpha_2: [c.alpha_3, c.name] for c in pycountry.countries}


if __name__ == "__main__":
    src = Path(codecarbon.__file__).parent / "data"
    dst = Path(__file__).resolve().parent.parent / "callbacks" / "data" / "codecarbon"
    for f in FILES:
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / f, dst / f)
    table = countries()
    lines = [f"{json.dumps(k)}: {json.dumps(table[k], ensure_ascii=False)}" for k in sorted(table)]
    (dst / "countries.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
