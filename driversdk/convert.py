"""Conversion between the SDK's dataclasses and Nomad's driver protobuf messages.

The only module besides the transport that knows the wire types; both the plugin side
(servicer) and the host side (DriverClient) go through it so the two can never disagree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

from google.protobuf import duration_pb2, timestamp_pb2

from driversdk.model import (
    GO_ZERO_TIME_SECONDS,
    Attribute,
    AttributeValue,
    Capabilities,
    CpuField,
    CpuUsage,
    Device,
    DNSConfig,
    ExecResult,
    ExitResult,
    Fingerprint,
    FSIsolation,
    HealthState,
    HostsConfig,
    LinuxResources,
    MemoryField,
    MemoryUsage,
    MountConfigSupport,
    NetworkIsolationMode,
    NetworkIsolationSpec,
    NetworkOverride,
    PortMapping,
    Resources,
    ResourceUsage,
    TaskConfig,
    TaskEvent,
    TaskHandle,
    TaskState,
    TaskStats,
    TaskStatus,
)
from driversdk.mounts import Mount, Propagation
from driversdk.pb import attribute_pb2, driver_pb2

# --- time ------------------------------------------------------------------------------------


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def timestamp_to_proto(when: datetime | None) -> timestamp_pb2.Timestamp:
    """A timestamp that is always set: None becomes Go's zero time, which Nomad reads as 'not yet'.

    A naive datetime is taken as UTC. Computed from the timedelta since the epoch, which is exact
    (days, seconds and microseconds are integers, normalised as Timestamp wants: nanos >= 0) and a
    few times cheaper than Timestamp.FromDatetime, paid for every stats sample of every task.
    """
    if when is None:
        return timestamp_pb2.Timestamp(seconds=GO_ZERO_TIME_SECONDS, nanos=0)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    since = when - _EPOCH
    return timestamp_pb2.Timestamp(seconds=since.days * 86400 + since.seconds, nanos=since.microseconds * 1000)


def timestamp_from_proto(ts: timestamp_pb2.Timestamp) -> datetime | None:
    if ts.seconds == GO_ZERO_TIME_SECONDS and ts.nanos == 0:
        return None
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToDatetime(tzinfo=UTC)


def duration_to_proto(seconds: float | None) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    if seconds:
        d.FromNanoseconds(int(seconds * 1e9))
    return d


def duration_from_proto(d: duration_pb2.Duration) -> float:
    return d.ToNanoseconds() / 1e9


# --- attributes and fingerprints -------------------------------------------------------------


def attribute_to_proto(value: Attribute | AttributeValue) -> attribute_pb2.Attribute:
    attr = Attribute.of(value)
    out = attribute_pb2.Attribute(unit=attr.unit)
    v = attr.value
    # bool first: bool is a subclass of int in Python.
    if isinstance(v, bool):
        out.bool_val = v
    elif isinstance(v, int):
        out.int_val = v
    elif isinstance(v, float):
        out.float_val = v
    else:
        out.string_val = v
    return out


def attribute_from_proto(pb: attribute_pb2.Attribute) -> Attribute:
    kind = pb.WhichOneof("value")
    value: AttributeValue
    if kind == "bool_val":
        value = pb.bool_val
    elif kind == "int_val":
        value = pb.int_val
    elif kind == "float_val":
        value = pb.float_val
    else:
        value = pb.string_val
    return Attribute(value, pb.unit)


def fingerprint_to_proto(fp: Fingerprint) -> driver_pb2.FingerprintResponse:
    return driver_pb2.FingerprintResponse(
        attributes={k: attribute_to_proto(v) for k, v in fp.attributes.items()},
        health=driver_pb2.FingerprintResponse.HealthState.ValueType(fp.health),
        health_description=fp.health_description,
        err=fp.err,
    )


def fingerprint_from_proto(pb: driver_pb2.FingerprintResponse) -> Fingerprint:
    return Fingerprint(
        health=HealthState(pb.health),
        health_description=pb.health_description,
        attributes={k: attribute_from_proto(v) for k, v in pb.attributes.items()},
        err=pb.err,
    )


# --- capabilities ----------------------------------------------------------------------------


def capabilities_to_proto(caps: Capabilities) -> driver_pb2.DriverCapabilities:
    return driver_pb2.DriverCapabilities(
        send_signals=caps.send_signals,
        exec=caps.exec,
        fs_isolation=driver_pb2.DriverCapabilities.FSIsolation.ValueType(caps.fs_isolation),
        network_isolation_modes=[
            driver_pb2.NetworkIsolationSpec.NetworkIsolationMode.ValueType(m) for m in caps.network_isolation_modes
        ],
        must_create_network=caps.must_create_network,
        mount_configs=driver_pb2.DriverCapabilities.MountConfigs.ValueType(caps.mount_configs),
        disable_log_collection=caps.disable_log_collection,
        dynamic_workload_users=caps.dynamic_workload_users,
    )


def capabilities_from_proto(pb: driver_pb2.DriverCapabilities) -> Capabilities:
    return Capabilities(
        send_signals=pb.send_signals,
        exec=pb.exec,
        fs_isolation=FSIsolation(pb.fs_isolation),
        network_isolation_modes=tuple(NetworkIsolationMode(m) for m in pb.network_isolation_modes),
        must_create_network=pb.must_create_network,
        mount_configs=MountConfigSupport(pb.mount_configs),
        disable_log_collection=pb.disable_log_collection,
        dynamic_workload_users=pb.dynamic_workload_users,
    )


# --- network ---------------------------------------------------------------------------------


def network_spec_to_proto(spec: NetworkIsolationSpec) -> driver_pb2.NetworkIsolationSpec:
    pb = driver_pb2.NetworkIsolationSpec(
        mode=driver_pb2.NetworkIsolationSpec.NetworkIsolationMode.ValueType(spec.mode),
        path=spec.path,
        labels=dict(spec.labels),
    )
    if spec.hosts is not None:
        pb.hostsConfig.CopyFrom(driver_pb2.HostsConfig(hostname=spec.hosts.hostname, address=spec.hosts.address))
    return pb


def network_spec_from_proto(pb: driver_pb2.NetworkIsolationSpec) -> NetworkIsolationSpec:
    hosts = None
    if pb.HasField("hostsConfig"):
        hosts = HostsConfig(hostname=pb.hostsConfig.hostname, address=pb.hostsConfig.address)
    return NetworkIsolationSpec(mode=NetworkIsolationMode(pb.mode), path=pb.path, labels=dict(pb.labels), hosts=hosts)


def network_override_to_proto(override: NetworkOverride) -> driver_pb2.NetworkOverride:
    return driver_pb2.NetworkOverride(
        port_map=dict(override.port_map), addr=override.addr, auto_advertise=override.auto_advertise
    )


def network_override_from_proto(pb: driver_pb2.NetworkOverride) -> NetworkOverride:
    return NetworkOverride(port_map=dict(pb.port_map), addr=pb.addr, auto_advertise=pb.auto_advertise)


# --- task config -----------------------------------------------------------------------------


def _resources_to_proto(res: Resources) -> driver_pb2.Resources:
    lin = res.linux
    return driver_pb2.Resources(
        allocated_resources=driver_pb2.AllocatedTaskResources(
            cpu=driver_pb2.AllocatedCpuResources(cpu_shares=res.cpu_shares),
            memory=driver_pb2.AllocatedMemoryResources(memory_mb=res.memory_mb, memory_max_mb=res.memory_max_mb),
        ),
        linux_resources=driver_pb2.LinuxResources(
            cpu_period=lin.cpu_period,
            cpu_quota=lin.cpu_quota,
            cpu_shares=lin.cpu_shares,
            memory_limit_bytes=lin.memory_limit_bytes,
            oom_score_adj=lin.oom_score_adj,
            cpuset_cpus=lin.cpuset_cpus,
            cpuset_cgroup=lin.cpuset_cgroup,
            PercentTicks=lin.percent_ticks,
        ),
        ports=[driver_pb2.PortMapping(label=p.label, value=p.value, to=p.to, host_ip=p.host_ip) for p in res.ports],
    )


def _resources_from_proto(pb: driver_pb2.Resources) -> Resources:
    alloc = pb.allocated_resources
    lin = pb.linux_resources
    return Resources(
        cpu_shares=alloc.cpu.cpu_shares,
        memory_mb=alloc.memory.memory_mb,
        memory_max_mb=alloc.memory.memory_max_mb,
        linux=LinuxResources(
            cpu_period=lin.cpu_period,
            cpu_quota=lin.cpu_quota,
            cpu_shares=lin.cpu_shares,
            memory_limit_bytes=lin.memory_limit_bytes,
            oom_score_adj=lin.oom_score_adj,
            cpuset_cpus=lin.cpuset_cpus,
            cpuset_cgroup=lin.cpuset_cgroup,
            percent_ticks=lin.PercentTicks,
        ),
        ports=tuple(PortMapping(p.label, p.value, p.to, p.host_ip) for p in pb.ports),
    )


def mount_to_proto(m: Mount) -> driver_pb2.Mount:
    return driver_pb2.Mount(
        task_path=m.task_path,
        host_path=m.host_path,
        readonly=m.readonly,
        propagation_mode=m.propagation.value,
        selinux_label=m.selinux_label,
        request_name=m.request_name,
    )


def mount_from_proto(pb: driver_pb2.Mount) -> Mount:
    """Raises UnknownPropagationError for a mode outside the three Nomad accepts."""
    return Mount(
        task_path=pb.task_path,
        host_path=pb.host_path,
        readonly=pb.readonly,
        propagation=Propagation.parse(pb.propagation_mode),
        selinux_label=pb.selinux_label,
        request_name=pb.request_name,
    )


def task_config_to_proto(task: TaskConfig) -> driver_pb2.TaskConfig:
    pb = driver_pb2.TaskConfig(
        id=task.id,
        name=task.name,
        msgpack_driver_config=task.msgpack_driver_config,
        env=dict(task.env),
        device_env=dict(task.device_env),
        resources=_resources_to_proto(task.resources),
        mounts=[mount_to_proto(m) for m in task.mounts],
        devices=[
            driver_pb2.Device(task_path=d.task_path, host_path=d.host_path, cgroup_permissions=d.cgroup_permissions)
            for d in task.devices
        ],
        user=task.user,
        alloc_dir=task.alloc_dir,
        stdout_path=task.stdout_path,
        stderr_path=task.stderr_path,
        task_group_name=task.task_group_name,
        job_name=task.job_name,
        alloc_id=task.alloc_id,
        job_id=task.job_id,
        namespace=task.namespace,
        node_name=task.node_name,
        node_id=task.node_id,
    )
    if task.network_isolation_spec is not None:
        pb.network_isolation_spec.CopyFrom(network_spec_to_proto(task.network_isolation_spec))
    if task.dns is not None:
        pb.dns.CopyFrom(
            driver_pb2.DNSConfig(
                servers=list(task.dns.servers),
                searches=list(task.dns.searches),
                options=list(task.dns.options),
            )
        )
    return pb


def task_config_from_proto(pb: driver_pb2.TaskConfig) -> TaskConfig:
    return TaskConfig(
        id=pb.id,
        name=pb.name,
        alloc_id=pb.alloc_id,
        job_name=pb.job_name,
        job_id=pb.job_id,
        task_group_name=pb.task_group_name,
        namespace=pb.namespace,
        node_name=pb.node_name,
        node_id=pb.node_id,
        env=dict(pb.env),
        device_env=dict(pb.device_env),
        resources=_resources_from_proto(pb.resources),
        mounts=[mount_from_proto(m) for m in pb.mounts],
        devices=[Device(d.task_path, d.host_path, d.cgroup_permissions) for d in pb.devices],
        user=pb.user,
        alloc_dir=pb.alloc_dir,
        stdout_path=pb.stdout_path,
        stderr_path=pb.stderr_path,
        network_isolation_spec=(
            network_spec_from_proto(pb.network_isolation_spec) if pb.HasField("network_isolation_spec") else None
        ),
        dns=(
            DNSConfig(tuple(pb.dns.servers), tuple(pb.dns.searches), tuple(pb.dns.options))
            if pb.HasField("dns")
            else None
        ),
        msgpack_driver_config=pb.msgpack_driver_config,
    )


# --- handles and results ---------------------------------------------------------------------


def task_handle_to_proto(handle: TaskHandle) -> driver_pb2.TaskHandle:
    if handle.version < 1:
        raise ValueError("task handle version 0 is reserved by Nomad; use 1 or higher")
    return driver_pb2.TaskHandle(
        version=handle.version,
        config=task_config_to_proto(handle.config),
        state=driver_pb2.TaskState.ValueType(handle.state),
        driver_state=handle.driver_state,
    )


def task_handle_from_proto(pb: driver_pb2.TaskHandle) -> TaskHandle:
    return TaskHandle(
        config=task_config_from_proto(pb.config),
        driver_state=pb.driver_state,
        version=pb.version,
        state=TaskState(pb.state),
    )


def exit_result_to_proto(result: ExitResult) -> driver_pb2.ExitResult:
    return driver_pb2.ExitResult(exit_code=result.exit_code, signal=result.signal, oom_killed=result.oom_killed)


def exit_result_from_proto(pb: driver_pb2.ExitResult) -> ExitResult:
    return ExitResult(exit_code=pb.exit_code, signal=pb.signal, oom_killed=pb.oom_killed)


def task_status_to_proto(status: TaskStatus) -> driver_pb2.TaskStatus:
    # Nomad's Go client dereferences result and both timestamps: always set them.
    return driver_pb2.TaskStatus(
        id=status.id,
        name=status.name,
        state=driver_pb2.TaskState.ValueType(status.state),
        started_at=timestamp_to_proto(status.started_at),
        completed_at=timestamp_to_proto(status.completed_at),
        result=exit_result_to_proto(status.result or ExitResult()),
    )


def task_status_from_proto(pb: driver_pb2.TaskStatus, driver: driver_pb2.TaskDriverStatus | None = None) -> TaskStatus:
    return TaskStatus(
        id=pb.id,
        name=pb.name,
        state=TaskState(pb.state),
        started_at=timestamp_from_proto(pb.started_at),
        completed_at=timestamp_from_proto(pb.completed_at),
        result=exit_result_from_proto(pb.result) if pb.HasField("result") else None,
        driver_attributes=dict(driver.attributes) if driver is not None else {},
    )


# --- stats and events ------------------------------------------------------------------------


def _usage_to_proto(usage: ResourceUsage) -> driver_pb2.TaskResourceUsage:
    cpu, mem = usage.cpu, usage.memory
    return driver_pb2.TaskResourceUsage(
        cpu=driver_pb2.CPUUsage(
            system_mode=cpu.system_mode,
            user_mode=cpu.user_mode,
            total_ticks=cpu.total_ticks,
            throttled_periods=cpu.throttled_periods,
            throttled_time=cpu.throttled_time,
            percent=cpu.percent,
            # CpuField and MemoryField are IntEnums: protobuf takes their members as the enum numbers.
            measured_fields=cast("tuple[driver_pb2.CPUUsage.Fields.ValueType, ...]", cpu.measured_fields),
        ),
        memory=driver_pb2.MemoryUsage(
            rss=mem.rss,
            cache=mem.cache,
            max_usage=mem.max_usage,
            kernel_usage=mem.kernel_usage,
            kernel_max_usage=mem.kernel_max_usage,
            usage=mem.usage,
            swap=mem.swap,
            measured_fields=cast("tuple[driver_pb2.MemoryUsage.Fields.ValueType, ...]", mem.measured_fields),
        ),
    )


def _usage_from_proto(pb: driver_pb2.TaskResourceUsage) -> ResourceUsage:
    cpu, mem = pb.cpu, pb.memory
    return ResourceUsage(
        cpu=CpuUsage(
            system_mode=cpu.system_mode,
            user_mode=cpu.user_mode,
            total_ticks=cpu.total_ticks,
            throttled_periods=cpu.throttled_periods,
            throttled_time=cpu.throttled_time,
            percent=cpu.percent,
            measured_fields=tuple(CpuField(f) for f in cpu.measured_fields),
        ),
        memory=MemoryUsage(
            rss=mem.rss,
            cache=mem.cache,
            max_usage=mem.max_usage,
            kernel_usage=mem.kernel_usage,
            kernel_max_usage=mem.kernel_max_usage,
            usage=mem.usage,
            swap=mem.swap,
            measured_fields=tuple(MemoryField(f) for f in mem.measured_fields),
        ),
    )


def task_stats_to_proto(stats: TaskStats) -> driver_pb2.TaskStats:
    # timestamp and agg_resource_usage must both be set: the Go decoder crashes or drops the sample.
    return driver_pb2.TaskStats(
        id=stats.id,
        timestamp=timestamp_to_proto(stats.timestamp),
        agg_resource_usage=_usage_to_proto(stats.usage),
        resource_usage_by_pid={pid: _usage_to_proto(u) for pid, u in stats.by_pid.items()},
    )


def task_stats_from_proto(pb: driver_pb2.TaskStats) -> TaskStats:
    return TaskStats(
        timestamp=timestamp_from_proto(pb.timestamp) or datetime.now(UTC),
        usage=_usage_from_proto(pb.agg_resource_usage),
        by_pid={pid: _usage_from_proto(u) for pid, u in pb.resource_usage_by_pid.items()},
        id=pb.id,
    )


def task_event_to_proto(event: TaskEvent) -> driver_pb2.DriverTaskEvent:
    return driver_pb2.DriverTaskEvent(
        task_id=event.task_id,
        alloc_id=event.alloc_id,
        task_name=event.task_name,
        timestamp=timestamp_to_proto(event.timestamp),
        message=event.message,
        annotations=dict(event.annotations),
    )


def task_event_from_proto(pb: driver_pb2.DriverTaskEvent) -> TaskEvent:
    return TaskEvent(
        task_id=pb.task_id,
        alloc_id=pb.alloc_id,
        task_name=pb.task_name,
        message=pb.message,
        timestamp=timestamp_from_proto(pb.timestamp) or datetime.now(UTC),
        annotations=dict(pb.annotations),
    )


def exec_result_to_proto(result: ExecResult) -> driver_pb2.ExecTaskResponse:
    return driver_pb2.ExecTaskResponse(
        stdout=result.stdout, stderr=result.stderr, result=exit_result_to_proto(result.result)
    )


def exec_result_from_proto(pb: driver_pb2.ExecTaskResponse) -> ExecResult:
    return ExecResult(stdout=pb.stdout, stderr=pb.stderr, result=exit_result_from_proto(pb.result))
