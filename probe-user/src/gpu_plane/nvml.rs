//! GPU telemetry from NVML (nvml-wrapper, which loads libnvidia-ml at run time): SM and memory
//! clocks, utilisation, temperature, power, energy, PCIe throughput, NVLink data counters,
//! memory in use and the clock-event (throttle) reasons, per device. A host without a driver is
//! a clean "no GPU".

use nvml_wrapper::{
    enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor},
    enums::device::SampleValue,
    struct_wrappers::device::FieldValueSample,
    structs::device::FieldId,
    sys_exports::field_id::{
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    },
    Nvml,
};

/// A field value as a number (None when NVML could not read it).
fn field_number(sample: &Result<FieldValueSample, nvml_wrapper::error::NvmlError>) -> Option<f64> {
    match sample.as_ref().ok()?.value.as_ref().ok()? {
        SampleValue::F64(v) => Some(*v),
        SampleValue::U32(v) => Some(f64::from(*v)),
        SampleValue::U64(v) => Some(*v as f64),
        SampleValue::I64(v) => Some(*v as f64),
    }
}

/// An initialised NVML with at least one device.
pub struct Gpus {
    nvml: Nvml,
    count: u32,
}

/// One reading: (series name, unit, value).
pub type Reading = (String, &'static str, f64);

impl Gpus {
    /// Opens NVML; the error says why there is no GPU telemetry.
    pub fn open() -> Result<Gpus, String> {
        let nvml = Nvml::init().map_err(|e| format!("no GPU: NVML is unavailable ({e})"))?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("no GPU: NVML cannot count devices ({e})"))?;
        if count == 0 {
            return Err("no GPU: NVML sees no device".into());
        }
        Ok(Gpus { nvml, count })
    }

    /// `name x count` for the model fingerprint's hardware line.
    pub fn describe(&self) -> String {
        let name = self
            .nvml
            .device_by_index(0)
            .and_then(|d| d.name())
            .unwrap_or_else(|_| "GPU".into());
        format!("{name} x{}", self.count)
    }

    /// Reads every device's gauges into `out` (a value a device does not support is skipped).
    pub fn read(&self, out: &mut Vec<Reading>) {
        for i in 0..self.count {
            let Ok(d) = self.nvml.device_by_index(i) else {
                continue;
            };
            let mut put = |what: &str, unit: &'static str, v: Option<f64>| {
                if let Some(v) = v {
                    out.push((format!("gpu{i}.{what}"), unit, v));
                }
            };
            put(
                "sm_clock",
                "MHz",
                d.clock_info(Clock::SM).ok().map(f64::from),
            );
            put(
                "mem_clock",
                "MHz",
                d.clock_info(Clock::Memory).ok().map(f64::from),
            );
            if let Ok(u) = d.utilization_rates() {
                put("util", "%", Some(f64::from(u.gpu)));
                put("mem_util", "%", Some(f64::from(u.memory)));
            }
            put(
                "temp",
                "C",
                d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
            );
            put(
                "power",
                "W",
                d.power_usage().ok().map(|mw| f64::from(mw) / 1e3),
            );
            put(
                "energy",
                "J",
                d.total_energy_consumption().ok().map(|mj| mj as f64 / 1e3),
            );
            // Data sent and received over NVLink since the driver loaded (KiB counters; the
            // trace's counter track shows the rate as its slope). Devices without NVLink
            // answer NotSupported and are skipped.
            if let Ok(v) = d.field_values_for(&[
                FieldId(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
                FieldId(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
            ]) {
                let mib = |i: usize| v.get(i).and_then(field_number).map(|kib| kib / 1024.0);
                put("nvlink_tx_total", "MiB", mib(0));
                put("nvlink_rx_total", "MiB", mib(1));
            }
            put(
                "pcie_tx",
                "MiB/s",
                d.pcie_throughput(PcieUtilCounter::Send)
                    .ok()
                    .map(|kb| f64::from(kb) / 1024.0),
            );
            put(
                "pcie_rx",
                "MiB/s",
                d.pcie_throughput(PcieUtilCounter::Receive)
                    .ok()
                    .map(|kb| f64::from(kb) / 1024.0),
            );
            put(
                "mem_used",
                "MiB",
                d.memory_info()
                    .ok()
                    .map(|m| m.used as f64 / (1 << 20) as f64),
            );
            put(
                "clock_event_reasons",
                "bits",
                d.current_throttle_reasons().ok().map(|r| r.bits() as f64),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_a_clean_no_gpu() {
        // CI machines have no NVIDIA driver; on a GPU machine this reads real gauges.
        match Gpus::open() {
            Err(e) => assert!(e.starts_with("no GPU: "), "{e}"),
            Ok(g) => {
                let mut out = Vec::new();
                g.read(&mut out);
                assert!(out.iter().any(|(n, _, _)| n == "gpu0.sm_clock"), "{out:?}");
            }
        }
    }

    #[test]
    fn field_values_become_numbers_and_unsupported_ones_nothing() {
        use nvml_wrapper::error::NvmlError;
        let sample = |value| {
            Ok(FieldValueSample {
                field: FieldId(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
                timestamp: 0,
                latency: 0,
                value,
            })
        };
        assert_eq!(
            field_number(&sample(Ok(SampleValue::U64(2048)))),
            Some(2048.0)
        );
        assert_eq!(field_number(&sample(Ok(SampleValue::U32(7)))), Some(7.0));
        assert_eq!(field_number(&sample(Err(NvmlError::NotSupported))), None);
        assert_eq!(field_number(&Err(NvmlError::NotSupported)), None);
    }
}
