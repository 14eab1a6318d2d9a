"""Reference for callbacks/tests/it/codecarbon.rs: what upstream's CodeCarbonCallback writes
through codecarbon 3.3.2 (its EmissionsTracker's `emissions.csv` in the Trainer's output_dir),
and the tables codecarbon estimates with, on this machine.

Writes OUT_DIR/codecarbon_callback.json:
  machine    what codecarbon detects here: platform.platform(), the CPU model (py-cpuinfo's
             brand_raw), counts, the RAM total, RAPL / NVIDIA / ROCm / Raspberry availability,
             the CPU's TDP and how it was found, the RAM power, the cloud and location lookups;
  cpu_match  [model name, TDP._get_matching_cpu's match or None, its TDP or None] for a list of
             CPU names (exact, cleaned and token-set matches, ambiguous and unknown ones);
  ram_power  [GB, arm, RAM._calculate_ram_power] for a list of sizes;
  emissions  [geo or cloud, kWh, Emissions' kg] for locations along every path of
             get_private_infra_emissions / get_cloud_emissions (regional tables of the USA,
             Canada, China and the Nordic bidding zones, the country mix, the world average,
             GCP regions, a forced intensity);
  csv_cells  [value, the cell pandas' to_csv writes for it in codecarbon's one-row frame];
  data       sha256 of codecarbon's data files that tchtrain carries (files), and pycountry's
             alpha-2 -> [alpha-3, name] table (countries);
  cases      upstream's callback driven through on_init_end / on_train_begin / on_train_end
             around ~1.5 s of work, each with the CODECARBON_* variables
             (and a .codecarbon.config) given: the CSV's header and text rows as
             _codecarbon_read.py reads them, and the files beside it. The "twice" case runs twice
             into one folder that starts with an emissions file of another header (backed up);
             the "located_*" cases answer codecarbon's location lookups from a local stand-in
             (`services`: [status, body] by path; GCP's region, geojs, ipinfo.io after an
             empty geojs region, AWS / Azure taken as private infrastructure).

Usage: python codecarbon_callback.py OUT_DIR
"""

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CPU_NAMES = [
    "AMD EPYC",
    "AMD EPYC 7763 64-Core Processor",
    "AMD EPYC 9654 96-Core Processor",
    "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz",
    "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
    "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz",
    "Intel(R) Xeon(R) CPU @ 2.20GHz",
    "Intel(R) Core(TM) i7-8700K CPU @ 3.70GHz",
    "Intel(R) Core(TM) i9-13900K",
    "13th Gen Intel(R) Core(TM) i7-13700H",
    "AMD Ryzen 9 5950X 16-Core Processor",
    "AMD Ryzen Threadripper PRO 5995WX 64-Cores",
    "AMD Ryzen 7 PRO 7840U w/ Radeon 780M Graphics",
    "Intel(R) Celeron(R) N4020 CPU @ 1.10GHz",
    "Apple M2",
    "Intel Xeon",
    "Neoverse-N1",
    "1075T",
    "ryzen 5 3600",
    "Intel(R) Core(TM) i5-8250U CPU @1.60GHz",
    "",
]

RAM_SIZES = [0.5, 2, 3.5, 4, 8, 15.5, 16, 23.54010009765625, 32, 48, 64, 100, 128, 129, 192, 256, 500, 512, 1024, 2048, 3000, 8192]

GEOS = [
    ["CAN", "Canada", "Quebec"],
    ["CAN", "Canada", "ontario"],
    ["CAN", "Canada", "nowhere"],
    ["CAN", "Canada", None],
    ["USA", "United States", "New York"],
    ["USA", "United States", "texas"],
    ["USA", "United States", "atlantis"],
    ["CHN", "China", "Guangdong Province"],
    ["CHN", "China", "beijing shi"],
    ["CHN", "China", "Tibet"],
    ["SWE", "Sweden", "SE3"],
    ["SWE", "Sweden", "stockholm"],
    ["NOR", "Norway", "no1"],
    ["FIN", "Finland", "FI"],
    ["FRA", "France", "Île-de-France"],
    ["DEU", "Germany", None],
    ["IND", "India", "karnataka"],
    ["XKX", "Kosovo", None],
    [None, None, None],
]

CLOUDS = [["gcp", "us-central1"], ["gcp", "europe-west1"], ["gcp", "mars-north1"], ["aws", "us-east-1"]]

CSV_VALUES = [0.0, 1.0, 20.0, 0.1, 1e-05, 5.947818141780145e-08, 0.8400314049467963, 1234.5, 1e16, 1.5e16,
              123456789.123, -71.2, 2.5e-300, 0, 2, 12, "", "AMD EPYC", "a, b", 'say "hi"', "two\nlines", None]

NOT_FOUND = [404, "not found"]
CLOUD_PATHS = {
    "aws": "/latest/dynamic/instance-identity/document",
    "azure": "/metadata/instance?api-version=2019-08-15",
    "gcp": "/computeMetadata/v1/instance/?recursive=true&alt=json",
}
# What a stand-in for the location services answers, by path (the cloud metadata service's
# three providers, geojs at /geo.json, ipinfo.io at /ipinfo): [status, JSON body or text].
NEW_YORK = {"country_code3": "USA", "country": "United States", "region": "New York", "latitude": "40.7128",
            "longitude": "-74.0060", "country_code": "US"}
SERVICES = {
    "gcp": {CLOUD_PATHS["aws"]: NOT_FOUND, CLOUD_PATHS["azure"]: NOT_FOUND,
            CLOUD_PATHS["gcp"]: [200, {"zone": "projects/705208488469/zones/europe-west1-b", "attributes": {"k": "v"}}],
            "/geo.json": [200, NEW_YORK], "/ipinfo": NOT_FOUND},
    "geojs": {CLOUD_PATHS["aws"]: NOT_FOUND, CLOUD_PATHS["azure"]: NOT_FOUND, CLOUD_PATHS["gcp"]: NOT_FOUND,
              "/geo.json": [200, NEW_YORK], "/ipinfo": NOT_FOUND},
    "ipinfo": {CLOUD_PATHS["aws"]: NOT_FOUND, CLOUD_PATHS["azure"]: [200, {"compute": {"location": "westeurope"}}],
               CLOUD_PATHS["gcp"]: NOT_FOUND, "/geo.json": [200, {"region": "", "country_code3": "SWE"}],
               "/ipinfo": [200, {"loc": "59.3293,18.0686", "country": "SE", "region": "Stockholm"}]},
}

CASES = [
    {"name": "defaults", "env": {}, "config": None, "runs": 1, "seconds": 1.5},
    {"name": "configured",
     "env": {"CODECARBON_PROJECT_NAME": "fine-tune, \"v2\"", "CODECARBON_EXPERIMENT_ID": "exp-42",
             "CODECARBON_PUE": "1.5", "CODECARBON_WUE": "2", "CODECARBON_FORCE_CPU_POWER": "100",
             "CODECARBON_FORCE_RAM_POWER": "7", "CODECARBON_MEASURE_POWER_SECS": "0.5",
             "CODECARBON_OUTPUT_FILE": "carbon.csv", "CODECARBON_LOG_LEVEL": "error"},
     "config": "[codecarbon]\nforce_carbon_intensity_g_co2e_kwh = 123.5\nproject_name = overridden\n", "runs": 1,
     "seconds": 1.5},
    {"name": "process", "env": {"CODECARBON_TRACKING_MODE": "process", "CODECARBON_MEASURE_POWER_SECS": "1"},
     "config": None, "runs": 1, "seconds": 1.5},
    {"name": "twice", "env": {"codecarbon_project_name": "lower-case variable"}, "config": None, "runs": 2,
     "seconds": 0.3, "existing": "timestamp,project_name,duration\n2024-01-01T00:00:00,old,1.0\n"},
    *[{"name": f"located_{name}", "env": {}, "config": None, "runs": 1, "seconds": 0.3, "services": services}
      for name, services in SERVICES.items()],
]


def sibling(stem):
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StandIn:
    """The location services' stand-in: a local HTTP server answering SERVICES[...] by path,
    and requests.get sending codecarbon's URLs to it (codecarbon's are fixed in its code)."""

    def __init__(self, answers):
        import http.server
        import threading

        import requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                status, body = answers.get(self.path, NOT_FOUND)
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{self.server.server_port}"
        self.original = requests.get
        routes = [("http://169.254.169.254", base), ("https://get.geojs.io/v1/ip/geo.json", base + "/geo.json"),
                  ("https://ipinfo.io/json", base + "/ipinfo")]

        def get(url, *args, **kwargs):
            for prefix, to in routes:
                if url.startswith(prefix):
                    url = to + url[len(prefix):]
            return self.original(url, *args, **kwargs)

        requests.get = get

    def close(self):
        import requests

        requests.get = self.original
        self.server.shutdown()


def run_case(case):
    stand_in = StandIn(case["services"]) if case.get("services") else None
    try:
        run_callback(case)
    finally:
        if stand_in:
            stand_in.close()


def run_callback(case):
    import time

    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import CodeCarbonCallback

    for _ in range(case["runs"]):
        args = TrainingArguments(output_dir="out", report_to=[], use_cpu=True)
        state, control = TrainerState(), TrainerControl()
        callback = CodeCarbonCallback()
        callback.on_init_end(args, state, control)
        callback.on_train_begin(args, state, control)
        end = time.perf_counter() + case["seconds"]
        x = 0
        while time.perf_counter() < end:  # a busy half, then an idle half
            x += 1
            if time.perf_counter() > end - case["seconds"] / 2:
                time.sleep(case["seconds"] / 2)
        callback.on_train_end(args, state, control)


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.lower().startswith("codecarbon_")}


def machine():
    import platform

    import psutil
    from codecarbon.core import cpu, gpu_amd, gpu_nvidia
    from codecarbon.core.util import count_cpus, count_physical_cpus, detect_cpu_model
    from codecarbon.external.geography import CloudMetadata, GeoMetadata
    from codecarbon.external.ram import RAM
    from codecarbon.input import DataSource

    tdp = cpu.TDP()
    t0 = time.time()
    cloud = CloudMetadata.from_utils()
    geo = GeoMetadata.from_geo_js(DataSource().geo_js_url)
    ram = RAM()
    return {
        "os": platform.platform(),
        "cpu_model": detect_cpu_model(),
        "cpu_count": count_cpus(),
        "cpu_physical_count": count_physical_cpus(),
        "ram_total_size": psutil.virtual_memory().total / (1024**3),
        "ram_power": ram.total_power().W,
        "rapl": cpu.is_rapl_available(),
        "nvidia": gpu_nvidia.is_nvidia_system(),
        "rocm": gpu_amd.is_rocm_system(),
        "raspberry": cpu.is_raspberry(),
        "tdp_model": tdp.model,
        "tdp": tdp.tdp,
        "cloud": [cloud.provider, cloud.region],
        "geo": {"country_iso_code": geo.country_iso_code, "country_name": geo.country_name, "region": geo.region,
                "latitude": geo.latitude, "longitude": geo.longitude},
        "lookup_seconds": time.time() - t0,
    }


def tables():
    import pandas as pd
    from codecarbon.core import cpu
    from codecarbon.core.emissions import Emissions
    from codecarbon.core.units import Energy
    from codecarbon.external.geography import CloudMetadata, GeoMetadata
    from codecarbon.external.ram import RAM
    from codecarbon.input import DataSource

    df = DataSource().get_cpu_power_data()
    tdp = cpu.TDP.__new__(cpu.TDP)
    cpu_match = []
    for name in CPU_NAMES:
        m = tdp._get_matching_cpu(name, df)
        cpu_match.append([name, m, None if m is None else cpu.TDP._get_cpu_constant_power(m, df)])
    ram_power = []
    for gb in RAM_SIZES:
        for arm in (False, True):
            ram = RAM()
            ram.is_arm_cpu = arm
            ram_power.append([gb, arm, ram._calculate_ram_power(gb)])
    emissions = []
    engine = Emissions(DataSource())
    for iso, name, region in GEOS:
        geo = GeoMetadata(country_iso_code=iso, country_name=name, region=region)
        for kwh in (1.0, 0.0123):
            emissions.append([{"geo": [iso, name, region]}, kwh,
                              engine.get_private_infra_emissions(Energy.from_energy(kWh=kwh), geo)])
    for provider, region in CLOUDS:
        cloud = CloudMetadata(provider=provider, region=region)
        for geo in (GeoMetadata(country_iso_code="FRA", country_name="France", region=None), None):
            entry = {"cloud": [provider, region], "geo": None if geo is None else ["FRA", "France", None]}
            row = [entry, 0.5, engine.get_cloud_emissions(Energy.from_energy(kWh=0.5), cloud, geo)]
            try:
                names = [engine.get_cloud_country_name(cloud), engine.get_cloud_country_iso_code(cloud),
                         engine.get_cloud_geo_region(cloud)]
                # pandas' NaN for an empty cell (codecarbon writes it as an empty cell)
                entry["names"] = [None if isinstance(n, float) and n != n else n for n in names]
            except ValueError:
                entry["names"] = None
            emissions.append(row)
    forced = Emissions(DataSource(), force_carbon_intensity_g_co2e_kwh=123.5)
    emissions.append([{"geo": ["CAN", "Canada", "quebec"], "forced": 123.5}, 0.25,
                      forced.get_private_infra_emissions(Energy.from_energy(kWh=0.25), GeoMetadata("CAN", "Canada", "quebec"))])
    emissions.append([{"cloud": ["gcp", "us-central1"], "geo": None, "forced": 123.5}, 0.25,
                      forced.get_cloud_emissions(Energy.from_energy(kWh=0.25), CloudMetadata("gcp", "us-central1"))])
    csv_cells = []
    for v in CSV_VALUES:
        text = pd.DataFrame.from_records([{"c": v}]).to_csv(index=False)
        csv_cells.append([v, text[len("c\n"):-1]])
    return {"cpu_match": cpu_match, "ram_power": ram_power, "emissions": emissions, "csv_cells": csv_cells}


DATA_FILES = ["hardware/cpu_power.csv", "private_infra/global_energy_mix.json",
              "private_infra/carbon_intensity_per_source.json", "private_infra/nordic_emissions.json",
              "private_infra/2023/usa_emissions.json", "private_infra/2023/canada_energy_mix.json",
              "private_infra/2023/china_provincial_emissions.json", "cloud/impact.csv"]


def data_hashes():
    import codecarbon
    import pycountry

    root = Path(codecarbon.__file__).parent / "data"
    return {"files": {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in DATA_FILES},
            "countries": {c.alpha_2: [c.alpha_3, c.name] for c in pycountry.countries}}


if __name__ == "__main__":
    import shutil

    OUT = Path(sys.argv[1])
    OUT.mkdir(parents=True, exist_ok=True)
    TMP = Path(tempfile.mkdtemp(prefix="tchtrain-codecarbon-reference-"))
    read = sibling("_codecarbon_read")
    base_env = clean_env()
    results = []
    # One after the other in this process (codecarbon reads its configuration, the working
    # directory's and HOME's .codecarbon.config and the environment when each tracker is made;
    # its hardware cache is keyed by the settings that change it).
    for case in CASES:
        work = TMP / case["name"]
        (work / "out").mkdir(parents=True)
        name = case["env"].get("CODECARBON_OUTPUT_FILE", "emissions.csv")
        if case["config"]:
            (work / ".codecarbon.config").write_text(case["config"])
        if case.get("existing"):
            (work / "out" / name).write_text(case["existing"])
        os.environ.clear()
        os.environ.update({**base_env, **case["env"], "HOME": str(work)})
        os.chdir(work)
        run_case(case)
        results.append({**case, "read": read.read(work / "out", name),
                        "files": sorted(p.name for p in (work / "out").iterdir())})
    os.environ.clear()
    os.environ.update({**base_env, "HOME": str(TMP)})
    os.chdir(TMP)
    out = {"machine": machine(), **tables(), "data": data_hashes(), "cases": results}
    (OUT / "codecarbon_callback.json").write_text(json.dumps(out, indent=1))
    shutil.rmtree(TMP, ignore_errors=True)
