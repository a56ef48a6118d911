//! Device memory from NVML, loaded at run time.
//!
//! `libnvidia-ml.so.1` ships with the NVIDIA driver, not with CUDA, so a worker
//! built once runs on machines with and without it: [`Nvml::load`] returns
//! `None` (with a debug log) when the library or a GPU is missing, and never
//! fails. The FFI is the five calls needed, as declared in `nvml.h`:
//!
//! ```c
//! nvmlReturn_t nvmlInit_v2(void);
//! nvmlReturn_t nvmlShutdown(void);
//! nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
//! nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
//! nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
//! typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
//! ```
//!
//! NVML numbers devices in PCI bus order and sees every GPU of the machine;
//! CUDA numbers the devices `CUDA_VISIBLE_DEVICES` leaves visible, so
//! `NvmlDevice::for_cuda` maps a CUDA index through that variable.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};

use libloading::Library;

use crate::engine::DeviceMemory;

/// `nvmlReturn_t`: 0 is `NVML_SUCCESS`.
type NvmlReturn = c_int;
/// `nvmlDevice_t`, an opaque handle.
type NvmlDeviceHandle = *mut c_void;

/// `nvmlMemory_t` (version 1): bytes, all three `unsigned long long`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

type InitFn = unsafe extern "C" fn() -> NvmlReturn;
type ShutdownFn = unsafe extern "C" fn() -> NvmlReturn;
type ByIndexFn = unsafe extern "C" fn(c_uint, *mut NvmlDeviceHandle) -> NvmlReturn;
type ByUuidFn = unsafe extern "C" fn(*const c_char, *mut NvmlDeviceHandle) -> NvmlReturn;
type MemoryFn = unsafe extern "C" fn(NvmlDeviceHandle, *mut NvmlMemory) -> NvmlReturn;

/// The library's soname, as the driver installs it.
pub(crate) const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// An initialised NVML; shut down on drop.
pub struct Nvml {
    shutdown: ShutdownFn,
    by_index: ByIndexFn,
    by_uuid: ByUuidFn,
    memory: MemoryFn,
    // Keeps the function pointers above valid; dropped after `Drop::drop`.
    _lib: Library,
}

// SAFETY: NVML is thread-safe (nvml.h: "all NVML calls are thread safe"), and
// the struct holds only function pointers into a library it keeps loaded.
unsafe impl Send for Nvml {}
unsafe impl Sync for Nvml {}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nvml")
    }
}

/// Which NVML device a CUDA device is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NvmlDevice {
    /// NVML's index (PCI bus order).
    Index(u32),
    /// A `GPU-…` or `MIG-…` UUID, as `CUDA_VISIBLE_DEVICES` may name devices.
    Uuid(String),
}

impl NvmlDevice {
    /// The NVML device behind CUDA device `cuda_index`, given the value of
    /// `CUDA_VISIBLE_DEVICES` (`None` when unset: the identity). Assumes NVML's
    /// PCI order matches CUDA's numbering, which holds on machines of one GPU
    /// model and under `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
    pub(crate) fn for_cuda(cuda_index: u32, visible: Option<&str>) -> Option<NvmlDevice> {
        let Some(list) = visible.map(str::trim).filter(|v| !v.is_empty()) else {
            return Some(NvmlDevice::Index(cuda_index));
        };
        let entry = list.split(',').map(str::trim).nth(cuda_index as usize)?;
        match entry.parse::<u32>() {
            Ok(i) => Some(NvmlDevice::Index(i)),
            Err(_) if entry.starts_with("GPU-") || entry.starts_with("MIG-") => {
                Some(NvmlDevice::Uuid(entry.to_owned()))
            }
            Err(_) => None,
        }
    }
}

/// Reads one function pointer out of the library.
///
/// # Safety
/// `T` must be the symbol's C type.
unsafe fn symbol<T: Copy>(lib: &Library, name: &[u8]) -> Option<T> {
    match unsafe { lib.get::<T>(name) } {
        Ok(s) => Some(*s),
        Err(e) => {
            tracing::debug!(cause = %e, "NVML lacks a symbol; no GPU memory figures");
            None
        }
    }
}

impl Nvml {
    /// Loads and initialises NVML; `None` when the library is absent or no
    /// driver answers.
    pub fn load() -> Option<Nvml> {
        Self::load_from(NVML_LIBRARY)
    }

    /// [`Nvml::load`] from an explicit library path or name.
    pub(crate) fn load_from(name: &str) -> Option<Nvml> {
        // SAFETY: loading NVML runs no initialisers with preconditions; the
        // symbol types are nvml.h's (module docs).
        let lib = match unsafe { Library::new(name) } {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(library = name, cause = %e, "NVML not available; no GPU memory figures");
                return None;
            }
        };
        // SAFETY: each symbol is read with its nvml.h type (module docs), and
        // the pointers are kept only alongside the library that holds them.
        let nvml = unsafe {
            let init: InitFn = symbol(&lib, b"nvmlInit_v2\0")?;
            let shutdown = symbol(&lib, b"nvmlShutdown\0")?;
            let by_index = symbol(&lib, b"nvmlDeviceGetHandleByIndex_v2\0")?;
            let by_uuid = symbol(&lib, b"nvmlDeviceGetHandleByUUID\0")?;
            let memory = symbol(&lib, b"nvmlDeviceGetMemoryInfo\0")?;
            let rc = init();
            if rc != 0 {
                tracing::debug!(code = rc, "nvmlInit_v2 failed; no GPU memory figures");
                return None;
            }
            Nvml {
                shutdown,
                by_index,
                by_uuid,
                memory,
                _lib: lib,
            }
        };
        tracing::debug!("NVML loaded");
        Some(nvml)
    }

    /// Memory of NVML device `index` (PCI order); `None` when NVML refuses.
    pub fn memory(&self, index: u32) -> Option<DeviceMemory> {
        self.memory_of(&NvmlDevice::Index(index))
    }

    /// Memory of a device named by index or UUID; `None` when NVML refuses.
    pub(crate) fn memory_of(&self, device: &NvmlDevice) -> Option<DeviceMemory> {
        let mut handle: NvmlDeviceHandle = std::ptr::null_mut();
        // SAFETY: the out-pointers are valid for the call, the UUID is a
        // NUL-terminated string that outlives it, and NVML was initialised.
        let rc = unsafe {
            match device {
                NvmlDevice::Index(i) => (self.by_index)(*i, &mut handle),
                NvmlDevice::Uuid(u) => {
                    let u = CString::new(u.as_str()).ok()?;
                    (self.by_uuid)(u.as_ptr(), &mut handle)
                }
            }
        };
        if rc != 0 {
            tracing::debug!(?device, code = rc, "NVML has no such device");
            return None;
        }
        let mut m = NvmlMemory::default();
        // SAFETY: `handle` came from NVML, `m` is an nvmlMemory_t.
        let rc = unsafe { (self.memory)(handle, &mut m) };
        if rc != 0 {
            tracing::debug!(?device, code = rc, "nvmlDeviceGetMemoryInfo failed");
            return None;
        }
        Some(DeviceMemory {
            used: m.used,
            total: m.total,
        })
    }

    /// Memory of CUDA device `cuda_index`, mapped through `CUDA_VISIBLE_DEVICES`.
    pub fn cuda_memory(&self, cuda_index: u32) -> Option<DeviceMemory> {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        self.memory_of(&NvmlDevice::for_cuda(cuda_index, visible.as_deref())?)
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: NVML was initialised by `load_from`; every init is paired
        // with one shutdown (NVML reference-counts them).
        unsafe {
            (self.shutdown)();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_struct_is_three_u64() {
        assert_eq!(std::mem::size_of::<NvmlMemory>(), 24);
    }

    #[test]
    fn missing_library_is_none_not_an_error() {
        assert!(Nvml::load_from("libnvidia-ml-does-not-exist.so.1").is_none());
    }

    #[test]
    fn a_library_without_nvml_symbols_is_none() {
        // libc is loaded in every process and has none of NVML's symbols.
        assert!(Nvml::load_from("libc.so.6").is_none());
    }

    #[test]
    fn loading_never_panics_here() {
        // On a machine without the NVIDIA driver this is None; with one it
        // must report a device whose used memory fits in its total.
        if let Some(n) = Nvml::load() {
            if let Some(m) = n.memory(0) {
                assert!(m.used <= m.total);
            }
        }
    }

    #[test]
    fn cuda_indexes_map_through_visible_devices() {
        assert_eq!(NvmlDevice::for_cuda(1, None), Some(NvmlDevice::Index(1)));
        assert_eq!(
            NvmlDevice::for_cuda(0, Some("")),
            Some(NvmlDevice::Index(0))
        );
        assert_eq!(
            NvmlDevice::for_cuda(1, Some("3, 5")),
            Some(NvmlDevice::Index(5))
        );
        assert_eq!(NvmlDevice::for_cuda(2, Some("3,5")), None);
        assert_eq!(
            NvmlDevice::for_cuda(0, Some("GPU-8f6c-11")),
            Some(NvmlDevice::Uuid("GPU-8f6c-11".into()))
        );
        assert_eq!(NvmlDevice::for_cuda(0, Some("nonsense")), None);
    }
}
