//! The settings that [`Config::resolve`] reads as a group: the network, the kernel scheduler, what jobs may keep, and who may do what.

use super::*;

/// The TCP listener and its TLS files: the three files go together, and TCP is served
/// only with them.
pub(super) fn listen_and_tls(
    listen: Option<SocketAddr>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> Result<(Option<SocketAddr>, Option<TlsFiles>), ConfigError> {
    let tls = match (cert, key, client_ca) {
        (Some(cert), Some(key), Some(client_ca)) => Some(TlsFiles {
            cert,
            key,
            client_ca,
        }),
        (None, None, None) => None,
        _ => {
            return Err(ConfigError::Invalid {
                field: "tls_cert",
                message: "tls_cert, tls_key and tls_client_ca go together".into(),
            });
        }
    };
    if let Some(addr) = listen
        && tls.is_none()
    {
        return Err(ConfigError::Invalid {
            field: "listen",
            message: format!(
                "{addr}: TCP needs TLS with client certificates (tls_cert, tls_key, \
                 tls_client_ca); without them use the Unix socket"
            ),
        });
    }
    Ok((listen, tls))
}

/// The device wait's grain when the device wait is on (`None`: off); a grain without it,
/// or over the gates' hard bound, is refused.
pub(super) fn device_wait(
    on: bool,
    grain: Option<Duration>,
) -> Result<Option<Duration>, ConfigError> {
    if grain.is_some() && !on {
        return Err(ConfigError::Invalid {
            field: "kernel_device_wait_grain",
            message: "acts only with kernel_device_wait on".into(),
        });
    }
    let wait = on.then(|| grain.unwrap_or(Duration::ZERO));
    if let Some(grain) = wait
        && grain > MAX_KERNEL_BASE
    {
        return Err(ConfigError::Invalid {
            field: "kernel_device_wait_grain",
            message: format!("{grain:?} is over {MAX_KERNEL_BASE:?}"),
        });
    }
    Ok(wait)
}

/// The kernel scheduler's settings.
#[derive(Debug)]
pub(super) struct KernelSettings {
    pub(super) policy: Option<mmk_kernel_sched::PolicyKind>,
    pub(super) hold_budget: u32,
    pub(super) base: Option<Duration>,
    pub(super) device_wait: Option<Duration>,
    pub(super) gate_dir: PathBuf,
}

pub(super) fn kernel_settings(
    args: &mut Args,
    file: &mut FileConfig,
    data_dir: &Path,
) -> Result<KernelSettings, ConfigError> {
    let hold_budget = args
        .kernel_hold_budget
        .take()
        .or(file.kernel_hold_budget.take())
        .unwrap_or(DEFAULT_KERNEL_HOLD_BUDGET);
    if hold_budget > 100 {
        return Err(ConfigError::Invalid {
            field: "kernel_hold_budget",
            message: format!("{hold_budget} is not a percentage (0 to 100)"),
        });
    }
    let policy =
        match args
            .kernel_policy
            .take()
            .or(file.kernel_policy.take())
            .as_deref()
        {
            None => Some(mmk_kernel_sched::PolicyKind::Mmk),
            Some("off") => None,
            Some(name) => Some(name.parse().map_err(|e: mmk_kernel_sched::UnknownName| {
                ConfigError::Invalid {
                    field: "kernel_policy",
                    message: format!("{e}, or off"),
                }
            })?),
        };
    let base = duration_setting(
        args.kernel_base.take(),
        file.kernel_base.take(),
        "kernel_base",
    )?;
    if let Some(base) = base
        && base > MAX_KERNEL_BASE
    {
        return Err(ConfigError::Invalid {
            field: "kernel_base",
            message: format!("{base:?} is over {MAX_KERNEL_BASE:?}, the gate's hard bound"),
        });
    }
    let grain = duration_setting(
        args.kernel_device_wait_grain.take(),
        file.kernel_device_wait_grain.take(),
        "kernel_device_wait_grain",
    )?;
    let device_wait = device_wait(
        args.kernel_device_wait || file.kernel_device_wait.unwrap_or(false),
        grain,
    )?;
    let gate_dir = absolute(
        args.kernel_gate_dir
            .take()
            .or(file.kernel_gate_dir.take())
            .unwrap_or_else(|| data_dir.join("ksched")),
        "kernel_gate_dir",
    )?;
    if device_wait.is_some() && policy.is_some() {
        on_memory_fs(&gate_dir).map_err(|message| ConfigError::Invalid {
            field: "kernel_gate_dir",
            message: format!(
                "{message}; --kernel-device-wait needs the gates on a memory file system \
                 (the driver maps a gate's page for the GPU only from one), for example \
                 --kernel-gate-dir /dev/shm/mmk"
            ),
        })?;
    }
    Ok(KernelSettings {
        policy,
        hold_budget,
        base,
        device_wait,
        gate_dir,
    })
}

/// The TCP listener, its TLS files and the metrics address.
pub(super) type Network = (Option<SocketAddr>, Option<TlsFiles>, Option<MetricsAddr>);

pub(super) fn network(args: &mut Args, file: &mut FileConfig) -> Result<Network, ConfigError> {
    let (listen, tls) = listen_and_tls(
        args.listen.take().or(file.listen.take()),
        args.tls_cert.take().or(file.tls_cert.take()),
        args.tls_key.take().or(file.tls_key.take()),
        args.tls_client_ca.take().or(file.tls_client_ca.take()),
    )?;
    let metrics = match args.metrics.take().or(file.metrics.take()) {
        None => Some(MetricsAddr {
            addr: DEFAULT_METRICS.parse().map_err(|e| ConfigError::Invalid {
                field: "metrics",
                message: format!("{DEFAULT_METRICS}: {e}"),
            })?,
            default: true,
        }),
        Some(text) if text == "off" => None,
        Some(text) => Some(MetricsAddr {
            addr: text.parse().map_err(|e| ConfigError::Invalid {
                field: "metrics",
                message: format!("{text:?} is not an address like 127.0.0.1:9410 or off ({e})"),
            })?,
            default: false,
        }),
    };
    if let Some(m) = metrics
        && !m.addr.ip().is_loopback()
        && tls.is_none()
    {
        return Err(ConfigError::Invalid {
            field: "metrics",
            message: format!(
                "{}: beyond loopback metrics need TLS with client certificates \
                 (tls_cert, tls_key, tls_client_ca), as the TCP API does",
                m.addr
            ),
        });
    }
    Ok((listen, tls, metrics))
}

/// The Kubernetes device plugin, with `--kubelet-dir`.
pub(super) fn kubelet(
    args: &mut Args,
    file: &mut FileConfig,
    capacity_unit_mib: u64,
) -> Result<Option<crate::k8s::PluginConfig>, ConfigError> {
    let check_every = duration_setting(
        args.kubelet_check_interval.take(),
        file.kubelet_check_interval.take(),
        "kubelet_check_interval",
    )?
    .unwrap_or(Duration::from_secs(2));
    if !(Duration::from_millis(10)..=crate::k8s::MAX_CHECK).contains(&check_every) {
        return Err(ConfigError::Invalid {
            field: "kubelet_check_interval",
            message: format!(
                "{check_every:?} is outside 10ms..=20s (the plugin's leases last 60s)"
            ),
        });
    }
    let kubelet = args
        .kubelet_dir
        .take()
        .or(file.kubelet_dir.take())
        .map(|dir| {
            let pod_resources = args
                .kubelet_pod_resources
                .take()
                .or(file.kubelet_pod_resources.take())
                .unwrap_or_else(|| dir.join("../pod-resources/kubelet.sock"));
            crate::k8s::PluginConfig {
                kubelet_dir: dir,
                pod_resources,
                unit_mib: capacity_unit_mib,
                check_every,
            }
        });
    Ok(kubelet)
}

/// What a job may keep: its logs, its folder, and its record after it ended.
pub(super) fn job_limits(
    args: &mut Args,
    file: &mut FileConfig,
) -> Result<(u64, Option<u64>, Duration, crate::node::HistoryPolicy), ConfigError> {
    let job_log_max = match args.job_log_max.take().or(file.job_log_max.take()) {
        None => crate::joblog::DEFAULT_JOB_LOG_MAX,
        Some(text) => mmk_core::units::parse_memory_mib(&text)
            .map_err(|e| e.to_string())
            .map(|mib| mib.saturating_mul(1024 * 1024))
            .and_then(|b| {
                if b < crate::joblog::MIN_JOB_LOG_MAX {
                    Err(format!("{text} is less than 1M"))
                } else {
                    Ok(b)
                }
            })
            .map_err(|message| ConfigError::Invalid {
                field: "job_log_max",
                message,
            })?,
    };
    let job_disk_max = match args.job_disk_max.take().or(file.job_disk_max.take()) {
        None => None,
        Some(text) => Some(
            mmk_core::units::parse_memory_mib(&text)
                .map_err(|e| e.to_string())
                .and_then(|mib| {
                    if mib == 0 {
                        Err(format!("{text} is less than 1M"))
                    } else {
                        Ok(mib.saturating_mul(1024 * 1024))
                    }
                })
                .map_err(|message| ConfigError::Invalid {
                    field: "job_disk_max",
                    message,
                })?,
        ),
    };
    let job_retention = duration_setting(
        args.job_retention.take(),
        file.job_retention.take(),
        "job_retention",
    )?
    .unwrap_or(crate::disk::DEFAULT_RETENTION);
    let history = crate::node::HistoryPolicy {
        keep_for: duration_setting(
            args.job_history.take(),
            file.job_history.take(),
            "job_history",
        )?
        .unwrap_or(crate::node::HistoryPolicy::default().keep_for),
        keep_per_user: args
            .job_history_keep
            .take()
            .or(file.job_history_keep.take())
            .unwrap_or(crate::node::HistoryPolicy::default().keep_per_user),
    };
    Ok((job_log_max, job_disk_max, job_retention, history))
}

/// Who may do what: the operators' group, the cluster schedulers' users, and the socket's
/// group.
pub(super) fn access(
    args: &mut Args,
    file: &mut FileConfig,
) -> Result<(crate::auth::Access, Option<u32>), ConfigError> {
    let group = |field: &'static str, name: String| {
        crate::auth::group_id(&name).ok_or(ConfigError::Invalid {
            field,
            message: format!("no group named {name:?} on this node"),
        })
    };
    let admin_gid = args
        .admin_group
        .take()
        .or(file.admin_group.take())
        .map(|g| group("admin_group", g))
        .transpose()?;
    let socket_group = args
        .socket_group
        .take()
        .or(file.socket_group.take())
        .map(|g| group("socket_group", g))
        .transpose()?;
    let scheduler_names = if args.scheduler_users.is_empty() {
        file.scheduler_users.take().unwrap_or_default()
    } else {
        std::mem::take(&mut args.scheduler_users)
    };
    let scheduler_uids = scheduler_names
        .iter()
        .map(|name| {
            crate::auth::user_id(name).ok_or(ConfigError::Invalid {
                field: "scheduler_users",
                message: format!("no user named {name:?} on this node"),
            })
        })
        .collect::<Result<Vec<u32>, ConfigError>>()?;
    Ok((
        crate::auth::Access::new(admin_gid, scheduler_uids),
        socket_group,
    ))
}

/// `path` made absolute, whatever the operator wrote: the MPS daemons and the jobs, which
/// run elsewhere, find their folders by these paths.
pub(super) fn absolute(path: PathBuf, field: &'static str) -> Result<PathBuf, ConfigError> {
    std::path::absolute(&path).map_err(|e| ConfigError::Invalid {
        field,
        message: format!("{}: {e}", path.display()),
    })
}

/// `slo_default` and `slo_control`: the default objective must be a slowdown of 1.01x to
/// 100x.
pub(super) fn slo_settings(
    args: &mut Args,
    file: &mut FileConfig,
) -> Result<Option<crate::slo::SloConfig>, ConfigError> {
    if args.no_slo_control || file.slo_control == Some(false) {
        return Ok(None);
    }
    let default_slowdown_pct = match args.slo_default.take().or(file.slo_default.take()) {
        None => crate::slo::DEFAULT_SLOWDOWN_PCT,
        Some(text) => {
            let invalid = |message: String| ConfigError::Invalid {
                field: "slo_default",
                message,
            };
            match mmk_core::units::parse_objective(&text).map_err(|e| invalid(e.to_string()))? {
                mmk_core::units::Objective::SlowdownPct(pct)
                    if mmk_core::spec::SLO_SLOWDOWN_PCT.contains(&pct) =>
                {
                    pct
                }
                mmk_core::units::Objective::SlowdownPct(_) => {
                    return Err(invalid(format!("{text} is outside 1.01x..=100x")));
                }
                mmk_core::units::Objective::LatencyMs(_) => {
                    return Err(invalid(format!(
                        "{text} is a latency; the default is a slowdown against running \
                         alone, such as 3x (a latency fits one service, not all)"
                    )));
                }
            }
        }
    };
    let settings = crate::slo::Settings::default();
    Ok(Some(crate::slo::SloConfig {
        default_slowdown_pct,
        settings: match args.slo_speed {
            Some(n) if n > 1 => settings.faster(n),
            _ => settings,
        },
    }))
}
