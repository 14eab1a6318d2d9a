//! codecarbon 3.3's reference data and the estimates it makes from it: a CPU's TDP from its
//! model name (`cpu.TDP`), the RAM's power from its size (`RAM._calculate_ram_power`), and the
//! carbon intensity of the electricity where the machine is (`core.emissions.Emissions`).
//!
//! The data are codecarbon's own files (MIT license), carried in `callbacks/data/codecarbon/`
//! (copied by `scripts/vendor_codecarbon_data.py`; the tests check them against the installed
//! package): `hardware/cpu_power.csv`, `private_infra/global_energy_mix.json`,
//! `carbon_intensity_per_source.json`, `nordic_emissions.json`, the 2023 tables of the USA,
//! Canada and China, `cloud/impact.csv`, and pycountry's ISO 3166 table (`countries.json`).

use std::collections::HashSet;
use std::sync::OnceLock;

use crate::{JsonMap, JsonValue, loads};

const CPU_POWER_CSV: &str = include_str!("../data/codecarbon/hardware/cpu_power.csv");
const GLOBAL_ENERGY_MIX: &str =
    include_str!("../data/codecarbon/private_infra/global_energy_mix.json");
const CARBON_INTENSITY_PER_SOURCE: &str =
    include_str!("../data/codecarbon/private_infra/carbon_intensity_per_source.json");
const NORDIC_EMISSIONS: &str =
    include_str!("../data/codecarbon/private_infra/nordic_emissions.json");
const USA_EMISSIONS: &str =
    include_str!("../data/codecarbon/private_infra/2023/usa_emissions.json");
const CANADA_ENERGY_MIX: &str =
    include_str!("../data/codecarbon/private_infra/2023/canada_energy_mix.json");
const CHINA_PROVINCIAL_EMISSIONS: &str =
    include_str!("../data/codecarbon/private_infra/2023/china_provincial_emissions.json");
const CLOUD_IMPACT_CSV: &str = include_str!("../data/codecarbon/cloud/impact.csv");
const COUNTRIES: &str = include_str!("../data/codecarbon/countries.json");

/// The data files carried, by their path under codecarbon's `data/` (the tests hash them).
pub const CODECARBON_DATA_FILES: [(&str, &str); 8] = [
    ("hardware/cpu_power.csv", CPU_POWER_CSV),
    ("private_infra/global_energy_mix.json", GLOBAL_ENERGY_MIX),
    (
        "private_infra/carbon_intensity_per_source.json",
        CARBON_INTENSITY_PER_SOURCE,
    ),
    ("private_infra/nordic_emissions.json", NORDIC_EMISSIONS),
    ("private_infra/2023/usa_emissions.json", USA_EMISSIONS),
    (
        "private_infra/2023/canada_energy_mix.json",
        CANADA_ENERGY_MIX,
    ),
    (
        "private_infra/2023/china_provincial_emissions.json",
        CHINA_PROVINCIAL_EMISSIONS,
    ),
    ("cloud/impact.csv", CLOUD_IMPACT_CSV),
];

/// codecarbon's `DEFAULT_POWER_PER_CORE`: watts per thread of a CPU missing from its table.
pub const DEFAULT_POWER_PER_CORE: f64 = 4.0;
/// codecarbon's `POWER_CONSTANT`: the TDP of a CPU whose model could not be read.
pub const POWER_CONSTANT: f64 = 85.0;
/// `EmissionsPerKWh.LBS_MWH_TO_KG_KWH`.
const LBS_MWH_TO_KG_KWH: f64 = 0.00045359237;
/// `EmissionsPerKWh.G_KWH_TO_KG_KWH`.
const G_KWH_TO_KG_KWH: f64 = 0.001;

/// The rows of a CSV file (RFC 4180 quoting, a leading byte-order mark dropped, as pandas).
pub fn csv_rows(text: &str) -> Vec<Vec<String>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut cell = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cell.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut cell)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut cell));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => cell.push(c),
        }
    }
    if !cell.is_empty() || !row.is_empty() {
        row.push(cell);
        rows.push(row);
    }
    rows
}

/// A data file parsed once (each use site keeps its parse).
macro_rules! data {
    ($text:expr) => {{
        static PARSED: OnceLock<JsonMap> = OnceLock::new();
        PARSED.get_or_init(|| json($text))
    }};
}

fn json(text: &str) -> JsonMap {
    match loads(text) {
        Ok(JsonValue::Object(m)) => m,
        _ => unreachable!("codecarbon's data files are JSON objects (checked by the tests)"),
    }
}

/// `cpu_power.csv`: (model name, TDP in watts).
fn cpu_power_table() -> &'static [(String, f64)] {
    static TABLE: OnceLock<Vec<(String, f64)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        csv_rows(CPU_POWER_CSV)
            .into_iter()
            .skip(1)
            .filter_map(|r| Some((r.first()?.clone(), r.get(1)?.trim().parse().ok()?)))
            .collect()
    })
}

/// rapidfuzz's `utils.default_process`: lower case, every character but letters and digits a
/// space, trimmed.
fn default_process(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_alphanumeric() {
                c.to_lowercase().next().unwrap_or(c)
            } else {
                ' '
            }
        })
        .collect::<String>()
        .trim()
        .to_string()
}

/// Upstream `TDP._get_matching_cpu` (non-greedy): the table's name equal to `model_raw` (any
/// case); else, `model_raw` cleaned (`(R)`, ` CPU @ ...`, ` CPU` and ` @ x.yGHz` removed),
/// equal to a name; else the only name whose words are all among the model's, or the other way
/// round (rapidfuzz's `token_set_ratio` of 100 — two such names: no match).
pub fn match_cpu(model_raw: &str) -> Option<(&'static str, f64)> {
    let table = cpu_power_table();
    let direct = |m: &str| {
        let m = m.to_lowercase();
        table
            .iter()
            .find(|(name, _)| !m.is_empty() && name.to_lowercase() == m)
    };
    if let Some((name, tdp)) = direct(model_raw) {
        return Some((name, *tdp));
    }
    let mut model = model_raw.replace("(R)", "");
    if let Some(i) = model.find(" CPU @ ").filter(|i| *i > 0) {
        model.truncate(i);
    }
    let model = model.replace(" CPU", "");
    static GHZ: OnceLock<regex::Regex> = OnceLock::new();
    let ghz = GHZ.get_or_init(|| regex::Regex::new(r" @\s*\d+\.\d+GHz").expect("valid"));
    let model = ghz.replace_all(&model, "").into_owned();
    if let Some((name, tdp)) = direct(&model) {
        return Some((name, *tdp));
    }
    let query = default_process(&model);
    let words: HashSet<&str> = query.split_whitespace().collect();
    if words.is_empty() {
        return None;
    }
    let mut found = table.iter().filter(|(name, _)| {
        let processed = default_process(name);
        let theirs: HashSet<&str> = processed.split_whitespace().collect();
        !theirs.is_empty()
            && theirs.iter().any(|w| words.contains(w))
            && (theirs.is_subset(&words) || words.is_subset(&theirs))
    });
    match (found.next(), found.next()) {
        (Some((name, tdp)), None) => Some((name, *tdp)),
        _ => None,
    }
}

/// Upstream `RAM._estimate_dimm_count`: the DIMMs a machine with `total_gb` of memory is
/// assumed to hold.
pub fn estimate_dimm_count(total_gb: f64) -> u32 {
    if total_gb <= 2.0 {
        return 1;
    }
    if total_gb <= 32.0 {
        return if total_gb <= 16.0 { 2 } else { 4 };
    }
    if total_gb <= 128.0 {
        return if total_gb <= 64.0 { 4 } else { 8 };
    }
    let mut dimm_count = 8;
    for dimm_size in [128.0, 64.0, 32.0, 16.0, 8.0, 4.0] {
        if dimm_size <= total_gb / 8.0 {
            dimm_count = ((total_gb / dimm_size).ceil() as u32).min(32);
            break;
        }
    }
    dimm_count
}

/// Upstream `RAM._calculate_ram_power`: 5 W per DIMM (1.5 W on ARM), less per DIMM past 4, 8
/// and 16, at least two DIMMs' worth (3 W on ARM).
pub fn ram_power_watts(memory_gb: f64, arm: bool) -> f64 {
    let dimm_count = f64::from(estimate_dimm_count(memory_gb));
    let (per_dimm, min_power) = if arm { (1.5, 3.0) } else { (5.0, 5.0 * 2.0) };
    let total = if dimm_count <= 4.0 {
        per_dimm * dimm_count
    } else if dimm_count <= 8.0 {
        per_dimm * 4.0 + per_dimm * 0.9 * (dimm_count - 4.0)
    } else if dimm_count <= 16.0 {
        per_dimm * 4.0 + per_dimm * 0.9 * 4.0 + per_dimm * 0.8 * (dimm_count - 8.0)
    } else {
        per_dimm * 4.0
            + per_dimm * 0.9 * 4.0
            + per_dimm * 0.8 * 8.0
            + per_dimm * 0.7 * (dimm_count - 16.0)
    };
    f64::max(min_power, total)
}

/// Where the machine is (codecarbon's `GeoMetadata`): the ISO code upper-cased, the region
/// lower-cased.
#[derive(Debug, Clone, PartialEq)]
pub struct GeoMetadata {
    /// ISO 3166 alpha-3 code.
    pub country_iso_code: Option<String>,
    /// The country's name.
    pub country_name: Option<String>,
    /// The region (state, province, bidding zone).
    pub region: Option<String>,
    /// Latitude.
    pub latitude: Option<f64>,
    /// Longitude.
    pub longitude: Option<f64>,
}

impl GeoMetadata {
    /// Upstream's constructor: the code upper-cased, the region lower-cased.
    pub fn new(
        country_iso_code: Option<&str>,
        country_name: Option<&str>,
        region: Option<&str>,
    ) -> Self {
        Self {
            country_iso_code: country_iso_code.map(str::to_uppercase),
            country_name: country_name.map(str::to_string),
            region: region.map(str::to_lowercase),
            latitude: None,
            longitude: None,
        }
    }

    /// Where codecarbon says the machine is when both location services fail.
    pub fn canada_default() -> Self {
        Self {
            latitude: Some(46.8),
            longitude: Some(-71.2),
            ..Self::new(Some("CAN"), Some("Canada"), Some("Quebec"))
        }
    }
}

/// A cloud region (codecarbon's `CloudMetadata`): both `None` on private infrastructure.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CloudMetadata {
    /// `gcp` (AWS and Azure are reported as private infrastructure, as codecarbon does).
    pub provider: Option<String>,
    /// The provider's region name.
    pub region: Option<String>,
}

impl CloudMetadata {
    /// Neither provider nor region.
    pub fn is_on_private_infra(&self) -> bool {
        self.provider.is_none() && self.region.is_none()
    }
}

/// One row of `cloud/impact.csv`.
#[derive(Debug, Clone)]
struct CloudRegion {
    provider: String,
    region: String,
    country_name: String,
    country_iso_code: String,
    state: Option<String>,
    impact: f64,
}

fn cloud_regions() -> &'static [CloudRegion] {
    static TABLE: OnceLock<Vec<CloudRegion>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let rows = csv_rows(CLOUD_IMPACT_CSV);
        let header = rows[0].clone();
        let col = |name: &str| header.iter().position(|h| h == name).expect("impact.csv");
        let (p, r, n, i, s, imp) = (
            col("provider"),
            col("region"),
            col("country_name"),
            col("countryIsoCode"),
            col("state"),
            col("impact"),
        );
        let opt = |v: &String| Some(v.clone()).filter(|v| !v.is_empty());
        rows[1..]
            .iter()
            .filter(|row| row.len() == header.len())
            .map(|row| CloudRegion {
                provider: row[p].clone(),
                region: row[r].clone(),
                country_name: row[n].clone(),
                country_iso_code: row[i].clone(),
                state: opt(&row[s]),
                impact: row[imp].parse().unwrap_or(f64::NAN),
            })
            .collect()
    })
}

fn cloud_region(cloud: &CloudMetadata) -> Option<&'static CloudRegion> {
    cloud_regions().iter().find(|row| {
        Some(row.provider.as_str()) == cloud.provider.as_deref()
            && Some(row.region.as_str()) == cloud.region.as_deref()
    })
}

/// Upstream `get_cloud_country_name` / `get_cloud_country_iso_code` / `get_cloud_geo_region`:
/// the cloud region's country, ISO code and state; `None` for a region not in `impact.csv`.
/// codecarbon means to fall back on the city when the state is empty, but pandas reads an empty
/// cell as NaN, which "is not None": the region is then empty, as here.
pub fn cloud_location(cloud: &CloudMetadata) -> Option<(String, String, Option<String>)> {
    let row = cloud_region(cloud)?;
    Some((
        row.country_name.clone(),
        row.country_iso_code.clone(),
        row.state.clone(),
    ))
}

/// codecarbon's `Emissions`: kilograms of CO2-equivalent for a quantity of energy, where the
/// machine is.
#[derive(Debug, Clone, Default)]
pub struct Emissions {
    /// `force_carbon_intensity_g_co2e_kwh`: used instead of the tables when set.
    pub force_carbon_intensity_g_co2e_kwh: Option<f64>,
}

fn world_average_kg_per_kwh() -> f64 {
    data!(CARBON_INTENSITY_PER_SOURCE)
        .get("world_average")
        .and_then(JsonValue::as_f64)
        .unwrap_or(475.0)
        * G_KWH_TO_KG_KWH
}

const NORDIC: [(&str, &[&str]); 3] = [
    ("SWE", &["SE1", "SE2", "SE3", "SE4"]),
    ("NOR", &["NO1", "NO2", "NO3", "NO4", "NO5"]),
    ("FIN", &["FI"]),
];

fn is_supported_nordic_region(geo: &GeoMetadata) -> bool {
    let (Some(iso), Some(region)) = (&geo.country_iso_code, &geo.region) else {
        return false;
    };
    NORDIC.iter().any(|(c, regions)| {
        *c == iso.to_uppercase() && regions.contains(&region.to_uppercase().as_str())
    })
}

impl Emissions {
    /// Upstream `get_cloud_emissions`: the region's impact from `impact.csv`; a region not in it
    /// falls back on the location's ([`get_private_infra_emissions`](Self::get_private_infra_emissions)),
    /// or on the world average without one.
    pub fn get_cloud_emissions(
        &self,
        energy_kwh: f64,
        cloud: &CloudMetadata,
        geo: Option<&GeoMetadata>,
    ) -> f64 {
        if let Some(forced) = self.force_carbon_intensity_g_co2e_kwh {
            return energy_kwh * (forced / 1000.0);
        }
        match cloud_region(cloud) {
            Some(row) => row.impact * G_KWH_TO_KG_KWH * energy_kwh,
            None => {
                log::warn!(
                    "Cloud electricity carbon intensity for provider '{}' and region '{}' not found, using country value instead.",
                    cloud.provider.as_deref().unwrap_or("None"),
                    cloud.region.as_deref().unwrap_or("None")
                );
                match geo {
                    Some(geo) => self.get_private_infra_emissions(energy_kwh, geo),
                    None => world_average_kg_per_kwh() * energy_kwh,
                }
            }
        }
    }

    /// Upstream `get_private_infra_emissions`: the forced intensity; else the region's table
    /// (USA, Canada, China, the Nordic bidding zones) when the region is known, else the
    /// country's energy mix, else the world average.
    pub fn get_private_infra_emissions(&self, energy_kwh: f64, geo: &GeoMetadata) -> f64 {
        if let Some(forced) = self.force_carbon_intensity_g_co2e_kwh {
            return energy_kwh * (forced / 1000.0);
        }
        let iso = geo.country_iso_code.as_deref().map(str::to_uppercase);
        let regional = geo.region.is_some()
            && (matches!(iso.as_deref(), Some("USA" | "CAN" | "CHN"))
                || is_supported_nordic_region(geo));
        if regional {
            match self.get_region_emissions(energy_kwh, geo) {
                Ok(kg) => return kg,
                Err(e) => {
                    log::error!("{e}");
                    log::warn!(
                        "Regional emissions retrieval failed. Falling back on country emissions."
                    );
                }
            }
        }
        self.get_country_emissions(energy_kwh, geo)
    }

    fn get_region_emissions(&self, energy_kwh: f64, geo: &GeoMetadata) -> Result<f64, String> {
        let iso = geo
            .country_iso_code
            .clone()
            .unwrap_or_default()
            .to_uppercase();
        let region = geo.region.clone().unwrap_or_default();
        if is_supported_nordic_region(geo) {
            let data = data!(NORDIC_EMISSIONS);
            if let Some(factor) = data
                .get("data")
                .and_then(|d| match d {
                    JsonValue::Object(m) => m.get(&region.to_uppercase()),
                    _ => None,
                })
                .and_then(|r| match r {
                    JsonValue::Object(m) => m.get("emission_factor").and_then(JsonValue::as_f64),
                    _ => None,
                })
            {
                return Ok(factor / 1000.0 * energy_kwh);
            }
        }
        if NORDIC.iter().any(|(c, _)| *c == iso) {
            return Ok(self.get_country_emissions(energy_kwh, geo));
        }
        if iso == "CHN" {
            let name = china_region_name(&region);
            let data = data!(CHINA_PROVINCIAL_EMISSIONS);
            if let Some(JsonValue::Object(provinces)) = data.get("data") {
                for (_, province) in provinces.iter() {
                    let JsonValue::Object(p) = province else {
                        continue;
                    };
                    let names = match p.get("names") {
                        Some(JsonValue::Array(a)) => a.clone(),
                        _ => continue,
                    };
                    if names
                        .iter()
                        .any(|n| matches!(n, JsonValue::Str(s) if *s == name))
                    {
                        let factor = p
                            .get("emission_factor")
                            .and_then(JsonValue::as_f64)
                            .unwrap_or(f64::NAN);
                        return Ok(factor / 1000.0 * energy_kwh);
                    }
                }
            }
            return Ok(self.get_country_emissions(energy_kwh, geo));
        }
        let per_kwh = match iso.as_str() {
            "USA" => {
                let data = data!(USA_EMISSIONS);
                let Some(JsonValue::Object(r)) = data.get(&region) else {
                    return Err(format!(
                        "Region: {region} not found for Country with ISO CODE : {iso}"
                    ));
                };
                r.get("emissions")
                    .and_then(JsonValue::as_f64)
                    .ok_or_else(|| format!("no emissions for the region {region}"))?
                    * LBS_MWH_TO_KG_KWH
            }
            "CAN" => {
                let data = data!(CANADA_ENERGY_MIX);
                let Some(JsonValue::Object(mix)) = data.get(&region) else {
                    return Err(format!("KeyError: '{region}'"));
                };
                region_energy_mix_to_emissions_rate(mix)?
            }
            _ => return Err(format!("no regional data for {iso}")),
        };
        Ok(per_kwh * energy_kwh)
    }

    /// Upstream `get_country_emissions`: the country's carbon intensity in
    /// `global_energy_mix.json` (or its mix of sources), the world average for a country not in
    /// it.
    fn get_country_emissions(&self, energy_kwh: f64, geo: &GeoMetadata) -> f64 {
        let mix = data!(GLOBAL_ENERGY_MIX);
        let country = geo.country_iso_code.as_deref().and_then(|iso| mix.get(iso));
        let Some(JsonValue::Object(country)) = country else {
            log::warn!(
                "We do not have data for {}, using world average.",
                geo.country_iso_code.as_deref().unwrap_or("None")
            );
            return world_average_kg_per_kwh() * energy_kwh;
        };
        global_energy_mix_to_emissions_rate(country) * energy_kwh
    }
}

/// Upstream `_CHINA_REGION_SUFFIX` applied to the region's words.
fn china_region_name(region: &str) -> String {
    let name = region
        .to_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    static SUFFIX: OnceLock<regex::Regex> = OnceLock::new();
    SUFFIX
        .get_or_init(|| {
            regex::Regex::new(r"\s+(autonomous region|municipality|province|sheng|shi|zizhiqu)$")
                .expect("valid")
        })
        .replace(&name, "")
        .into_owned()
}

/// Upstream `_global_energy_mix_to_emissions_rate`, in kg per kWh.
fn global_energy_mix_to_emissions_rate(mix: &JsonMap) -> f64 {
    if let Some(ci) = mix.get("carbon_intensity").and_then(JsonValue::as_f64) {
        return ci * G_KWH_TO_KG_KWH;
    }
    let per_source = data!(CARBON_INTENSITY_PER_SOURCE);
    let energy_sum = mix
        .get("total_TWh")
        .and_then(JsonValue::as_f64)
        .unwrap_or(f64::NAN);
    let (mut carbon_intensity, mut energy_sum_computed) = (0.0, 0.0);
    for (energy_type, per_year) in mix.iter() {
        let Some(source) = energy_type
            .find("_TWh")
            .map(|_| &energy_type[..energy_type.len() - 4])
        else {
            continue;
        };
        if let (Some(ci), Some(per_year)) = (
            per_source.get(source).and_then(JsonValue::as_f64),
            per_year.as_f64(),
        ) {
            carbon_intensity += (per_year / energy_sum) * ci;
            energy_sum_computed += per_year;
        }
    }
    if energy_sum_computed != energy_sum {
        return world_average_kg_per_kwh();
    }
    carbon_intensity * G_KWH_TO_KG_KWH
}

/// Upstream `_region_energy_mix_to_emissions_rate`: coal, petroleum and natural gas's shares
/// of the region's mix times their emissions (kg per kWh).
fn region_energy_mix_to_emissions_rate(mix: &JsonMap) -> Result<f64, String> {
    let total = mix
        .get("total")
        .and_then(JsonValue::as_f64)
        .ok_or("no total")?;
    let mut sum = 0.0;
    for (source, kg) in [
        ("coal", 0.995725971),
        ("petroleum", 0.8166885263),
        ("naturalGas", 0.7438415916),
    ] {
        let share = mix
            .get(source)
            .and_then(JsonValue::as_f64)
            .ok_or_else(|| format!("KeyError: '{source}'"))?
            / total;
        sum += share * kg;
    }
    Ok(sum)
}

/// pycountry's alpha-2 code -> (alpha-3 code, name), as codecarbon's backup location lookup
/// converts the country ipinfo.io answers with.
pub fn country_by_alpha_2(alpha_2: &str) -> Option<(String, String)> {
    let table = data!(COUNTRIES);
    match table.get(&alpha_2.to_uppercase()) {
        Some(JsonValue::Array(v)) => match v.as_slice() {
            [JsonValue::Str(a3), JsonValue::Str(name)] => Some((a3.clone(), name.clone())),
            _ => None,
        },
        _ => None,
    }
}

/// pycountry's table as carried (alpha-2 -> [alpha-3, name]), for the tests.
pub fn countries_table() -> JsonMap {
    data!(COUNTRIES).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_rows_reads_quotes_and_the_byte_order_mark() {
        let rows = csv_rows("\u{feff}a,b\n\"x, y\",\"say \"\"hi\"\"\"\n1,\n");
        assert_eq!(
            rows,
            vec![
                vec!["a".to_string(), "b".into()],
                vec!["x, y".into(), "say \"hi\"".into()],
                vec!["1".into(), "".into()],
            ]
        );
    }

    #[test]
    fn dimm_counts_follow_codecarbons_steps() {
        assert_eq!(estimate_dimm_count(2.0), 1);
        assert_eq!(estimate_dimm_count(16.0), 2);
        assert_eq!(estimate_dimm_count(23.5), 4);
        assert_eq!(estimate_dimm_count(100.0), 8);
        assert_eq!(estimate_dimm_count(256.0), 8);
        assert_eq!(estimate_dimm_count(3000.0), 24);
    }
}
