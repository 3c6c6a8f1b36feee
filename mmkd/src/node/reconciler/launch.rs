//! A placed job's launch: its MPS daemon and gate made ready, its run started off the state lock, and what the start means for the job's state.

use super::*;

impl Node {
    /// The partition's gate made ready for `job` (file I/O: off the runtime, like the MPS
    /// calls); the reason when it cannot be.
    async fn prepare_gate(
        &self,
        job: &JobRecord,
        a: &Assignment,
        gpus: &[GpuState],
    ) -> Result<Option<crate::ksched::JobKsched>, String> {
        let key = mps::partition_key(&a.slot, a.instance_id);
        // Making the gate is file I/O: off the runtime, like the MPS calls.
        let k = self.inner.runner.kernel_sched().clone();
        let sms = ksched::partition_sms(gpus, a);
        let (profile, policy) = match &job.spec.task {
            Task::Command(c) => (c.kernel_profile.clone(), c.kernel_policy.clone()),
            Task::Attached(a) => (None, a.kernel_policy.clone()),
            Task::Workload(_) => (None, None),
        };
        let online = job.spec.class == JobClass::Online;
        // The gate is the user's whose processes use it; the profile is read as they
        // would read it.
        let runs_as = runs_as(job);
        let gate_owner = runs_as.map_or_else(GateOwner::current, |o| GateOwner {
            uid: o.uid,
            gid: o.gid,
        });
        tokio::task::spawn_blocking(move || {
            let profile = profile.map(std::path::PathBuf::from);
            let tuning = if online {
                Some(
                    ksched::OnlineTuning::from_spec(policy.as_deref(), profile.as_deref(), runs_as)
                        .map_err(|e| crate::error::chain(&e))?,
                )
            } else {
                None
            };
            k.prepare(&key, sms, profile.as_deref(), tuning, gate_owner)
                .map_err(|e| crate::error::chain(&e))
        })
        .await
        .unwrap_or_else(|e| Err(format!("kernel scheduler: {e}")))
    }

    pub(super) async fn launch(
        &self,
        job: &JobRecord,
        a: Assignment,
        gpus: &[GpuState],
    ) -> ServiceResult<()> {
        let placed = format!(
            "placed on gpu {} {}@{}",
            a.slot.gpu, a.profile, a.slot.start
        );
        {
            // The pass read the job without the lock: a cancel may have ended it since.
            let _state = self.inner.state.lock().await;
            if self.get(job.id).await?.state != JobState::Queued {
                return Ok(());
            }
            self.transition(
                job.id,
                JobState::Starting,
                &placed,
                Change {
                    assignment: Some(a.clone()),
                    ..Change::default()
                },
            )
            .await?;
        }
        let mps_pipe = match self.inner.mps.ensure(mps::partition(gpus, &a)).await {
            Ok(pipe) => pipe,
            Err(why) => {
                self.not_started(job, crate::error::chain(&why));
                return Ok(());
            }
        };
        let prepared = self.prepare_gate(job, &a, gpus).await;
        let ksched = match prepared {
            Ok(k) => k,
            Err(why) => {
                self.not_started(job, why);
                return Ok(());
            }
        };
        let launch = Launch {
            mps_pipe,
            ksched,
            job: job.id,
            name: job.spec.name.clone(),
            class: job.spec.class,
            task: job.spec.task.clone(),
            assignment: a.clone(),
            restarts: job.restarts,
            owner: job.owner,
            memory_mib: job.spec.gpu_memory_mib,
        };
        // The job may have been cancelled while its partition was made ready: decided
        // under the state lock, as the cancel was.
        let state = self.inner.state.lock().await;
        if matches!(job.spec.task, Task::Attached(_)) {
            if self.get(job.id).await?.state != JobState::Starting {
                return Ok(()); // ended meanwhile (its end released what it held)
            }
            self.learn(job, &a, gpus, &launch);
            return self.attach(job, &launch).await;
        }
        let cancelled = self.cancelling().get(&job.id).cloned();
        if let Some(c) = cancelled {
            // Recorded now, so that the cancel hears of it at once.
            let change = Change {
                ended_by: c.by,
                ..Change::default()
            };
            self.transition(job.id, c.ends_as, &c.reason, change)
                .await?;
            self.cancelling().remove(&job.id);
            return Ok(());
        }
        drop(state);
        // Making the job's folders and forking it: off the state lock (API calls go on
        // meanwhile) and off the runtime's worker threads ([`crate::runner::Spawner`]).
        let (started, launch) = match &self.inner.spawner {
            Some(spawner) => {
                let node = self.clone();
                let started = spawner
                    .run(move || {
                        let started = node.inner.runner.start(&launch);
                        (started, launch)
                    })
                    .await;
                let Some(started) = started else {
                    self.not_started(job, "the thread that starts jobs has ended".into());
                    return Ok(());
                };
                started
            }
            None => (self.inner.runner.start(&launch), launch),
        };
        let pid = match started {
            Ok(pid) => pid,
            Err(why) => {
                self.not_started(job, crate::error::chain(&why));
                return Ok(());
            }
        };
        let state = self.inner.state.lock().await;
        if self.get(job.id).await?.state != JobState::Starting {
            // Its run ended already, and its exit was recorded.
            return Ok(());
        }
        self.learn(job, &a, gpus, &launch);
        self.started(job, &a, pid, "running").await?;
        // A cancel that came while the run was being started found nothing to stop: the
        // run is stopped now, and its exit records the cancel.
        let stop = match self.cancelling().get_mut(&job.id) {
            Some(c) if !c.stopped => {
                c.stopped = true;
                true
            }
            _ => false,
        };
        drop(state);
        if stop {
            self.inner.runner.stop(job.id).await;
        }
        Ok(())
    }

    /// Sample the job's gate slots into its learned profile while this run lasts (the
    /// transition that ends the run stops it). Nothing to sample without a gate.
    pub(super) fn learn(
        &self,
        job: &JobRecord,
        a: &Assignment,
        gpus: &[GpuState],
        launch: &Launch,
    ) {
        let (Some(k), Some(signature)) = (&launch.ksched, learn::signature(job.owner, &job.spec))
        else {
            return;
        };
        let gpu_sms = gpus
            .iter()
            .find(|g| g.index == a.slot.gpu)
            .map_or(0, |g| g.model.sm_count);
        let uid = runs_as(job).map_or_else(crate::os::euid, |o| o.uid);
        let learned = self.inner.learned.for_job(job.owner, &job.spec);
        self.inner.sampler.watch(
            job.id,
            Watch {
                signature,
                owner_uid: job.owner.map(|o| o.uid),
                name: job.spec.name.clone(),
                class: job.spec.class,
                gate: k.gate.clone(),
                partition: (a.slot.gpu, a.slot.profile_id.map(|_| a.instance_id)),
                partition_mem_frac: gpus
                    .iter()
                    .find(|g| g.index == a.slot.gpu)
                    .and_then(|g| {
                        let p = g.model.profile(a.slot.profile_id?)?;
                        Some(f64::from(p.memory_slices) / f64::from(g.model.memory_slices.max(1)))
                    })
                    .unwrap_or(1.0),
                gpu_sms,
                uid,
                learned: learned.is_some(),
                learned_ns_per_launch: learned
                    .as_ref()
                    .and_then(|l| l.observed.kernel_us())
                    .map(|us| us * 1e3),
                // The SLO control measures an online job's requests as they run.
                keep_tracked: self.inner.slo.is_some() && job.spec.class == JobClass::Online,
            },
        );
        self.control_slo(job, &mps::partition_key(&a.slot, a.instance_id));
    }

    /// A placed job's run has begun: its instance is in use and it is RUNNING.
    pub(in crate::node) async fn started(
        &self,
        job: &JobRecord,
        a: &Assignment,
        pid: Option<u32>,
        reason: &str,
    ) -> ServiceResult<()> {
        if a.slot.profile_id.is_some() {
            self.inner
                .backend
                .set_in_use(a.slot.gpu, a.instance_id, true);
        }
        let change = Change {
            pid,
            ..Change::default()
        };
        self.transition(job.id, JobState::Running, reason, change)
            .await?;
        Ok(())
    }

    /// A job that could not start: FAILED with the reason, recorded through the exit path
    /// (next loop turn), so that a store failure here cannot leave the job STARTING with
    /// nothing to end it.
    pub(super) fn not_started(&self, job: &JobRecord, why: String) {
        self.inner
            .pending_exits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Exit {
                job: job.id,
                run: job.restarts,
                outcome: Outcome::NotStarted(why),
                ended: std::time::Instant::now(),
            });
        self.inner.kick.notify_one();
    }
}
