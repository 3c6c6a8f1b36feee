//! The catalog against hardware: `tests/data/h200-nvml-gpus.json` is what
//! `mmkctl --output json gpus` printed with mmkd's NVML backend on an NVIDIA H200
//! (driver 580.159.04, MIG off; lab/scripts/gpu/nvml-inventory.sh, 2026-11-21). The simulated
//! H200 must be the GPU NVML describes.

use mmk_partitioner::catalog;
use serde_json::Value;

#[test]
fn the_simulated_h200_matches_what_nvml_reported() {
    let text = include_str!("data/h200-nvml-gpus.json");
    let reading: Value = serde_json::from_str(text).expect("fixture is JSON");
    let gpu = &reading["gpus"][0];
    let model = catalog::model("h200-141gb").expect("h200 in catalog");
    assert_eq!(gpu["model"], model.product_name.as_str());
    assert_eq!(gpu["memory_mib"], model.memory_mib);
    assert_eq!(gpu["sm_count"], model.sm_count);
    assert_eq!(gpu["memory_slices"], u64::from(model.memory_slices));

    let read = gpu["profiles"].as_array().expect("profiles");
    assert_eq!(read.len(), model.profiles.len());
    for p in &model.profiles {
        let r = read
            .iter()
            .find(|r| r["id"] == p.id)
            .unwrap_or_else(|| panic!("NVML did not report profile {}", p.id));
        let starts: Vec<u64> = p.starts.iter().map(|s| u64::from(*s)).collect();
        assert_eq!(r["name"], p.name.as_str(), "profile {}", p.id);
        assert_eq!(r["memory_mib"], p.memory_mib, "{}", p.name);
        assert_eq!(r["sm_count"], p.sm_count, "{}", p.name);
        assert_eq!(r["max_count"], u64::from(p.max_count), "{}", p.name);
        assert_eq!(
            r["compute_slices"],
            u64::from(p.compute_slices),
            "{}",
            p.name
        );
        assert_eq!(r["memory_slices"], u64::from(p.memory_slices), "{}", p.name);
        assert_eq!(r["starts"], serde_json::json!(starts), "{}", p.name);
        assert_eq!(r["media_extensions"], p.media_extensions, "{}", p.name);
    }
}
