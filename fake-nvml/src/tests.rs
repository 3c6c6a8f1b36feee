use super::*;
use crate::mig::nvmlDeviceGetGpuInstanceProfileInfo;
use nvml_wrapper_sys::bindings::NVML_GPU_INSTANCE_PROFILE_COUNT;

/// (ID, instances, SMs, GiB) of every profile, read through the NVML calls as mmkd
/// reads them, from a fake node of one GPU of catalog model `model`, MIG off.
fn profiles_through_nvml(model: &str) -> Vec<(u32, u32, u32, f64)> {
    let path =
        std::env::temp_dir().join(format!("mmk-fake-nvml-{}-{model}.json", std::process::id()));
    state::create(
        &path,
        &state::Node::new(&[(model.to_owned(), 1)], false).unwrap(),
    )
    .unwrap();
    // SAFETY: this test is the only one of this binary that reads the variable.
    unsafe { std::env::set_var(state::STATE_ENV, &path) };
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let mut device: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: out pointers to locals.
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByIndex_v2(0, &mut device) },
        SUCCESS
    );
    let mut out = Vec::new();
    for e in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
        // SAFETY: all-zero is a valid value of this plain struct.
        let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a handle of the fake and an out pointer.
        if unsafe { nvmlDeviceGetGpuInstanceProfileInfo(device, e, &mut info) } == SUCCESS {
            out.push((
                info.id,
                info.instanceCount,
                info.multiprocessorCount,
                info.memorySizeMB as f64 / 1024.0,
            ));
        }
    }
    assert_eq!(nvmlShutdown(), SUCCESS);
    let _ = std::fs::remove_file(&path);
    out.sort_by_key(|p| p.0);
    out
}

fn same(got: &[(u32, u32, u32, f64)], read: &[(u32, u32, u32, f64)]) {
    assert_eq!(got.len(), read.len(), "{got:?} against {read:?}");
    for (g, r) in got.iter().zip(read) {
        assert_eq!((g.0, g.1, g.2), (r.0, r.1, r.2), "{got:?} against {read:?}");
        assert!((g.3 - r.3).abs() <= 0.01, "{got:?} against {read:?}");
    }
}

/// A reading in data/ (`nvidia-smi mig -lgip` on a GPU): per profile its ID,
/// instances at most, SMs and memory (GiB), by ID.
fn read_lgip(record: &str) -> Vec<(u32, u32, u32, f64)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(record);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut read: Vec<(u32, u32, u32, f64)> = text
        .lines()
        .filter(|l| l.contains(" MIG "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let total = f[5].split('/').nth(1).unwrap();
            (
                f[4].parse().unwrap(),
                total.parse().unwrap(),
                f[8].parse().unwrap(),
                f[6].parse().unwrap(),
            )
        })
        .collect();
    read.sort_by_key(|p| p.0);
    assert_eq!(read.len(), 7, "{path:?}");
    read
}

/// The fake's profile table equals `nvidia-smi mig -lgip` as read on an H200 and on an
/// H100 80GB (driver 580.159.04, MIG off).
#[test]
fn the_profile_table_is_what_nvidia_smi_read_on_the_h200_and_h100() {
    same(
        &profiles_through_nvml("h200-141gb"),
        &read_lgip("h200-nvidia-smi-mig-lgip.txt"),
    );
    same(
        &profiles_through_nvml("h100-80gb"),
        &read_lgip("h100-nvidia-smi-mig-lgip.txt"),
    );
}

/// The H100 80GB's placements in the catalog (which the fake serves) are what
/// `nvidia-smi mig -lgipp` read there: `GPU  0 Profile ID 9 Placements: {0,4}:4`.
#[test]
fn the_h100_placements_are_what_nvidia_smi_read() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/h100-nvidia-smi-mig-lgipp.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    let model = mmk_partitioner::catalog::model("h100-80gb").unwrap();
    let mut seen = 0;
    for line in text.lines().filter(|l| l.contains("Profile ID")) {
        let (head, placements) = line.split_once(':').unwrap();
        let id: u32 = head.split_whitespace().nth(4).unwrap().parse().unwrap();
        let (starts, size) = placements.trim().rsplit_once(':').unwrap();
        let starts: Vec<u8> = starts
            .trim_matches(|c| c == '{' || c == '}')
            .split(',')
            .map(|s| s.parse().unwrap())
            .collect();
        let p = model.profile(id).unwrap();
        assert_eq!(
            (&p.starts, p.memory_slices),
            (&starts, size.parse().unwrap()),
            "profile {id}: {line}"
        );
        seen += 1;
    }
    assert_eq!(seen, model.profiles.len(), "{path:?}");
}

#[test]
fn handles_say_what_they_name() {
    for h in [
        Handle::Device(0),
        Handle::Device(7),
        Handle::GpuInstance(3, 12),
        Handle::ComputeInstance(1, 4),
        Handle::MigDevice(2, 9),
    ] {
        assert_eq!(decode(encode(h)), Some(h), "{h:?}");
    }
    assert_eq!(decode(0), None);
}
