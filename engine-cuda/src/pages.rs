//! Page spaces on the GPU. Each space the engine maps (its local pool, an arena attachment) is
//! host memory, registered with the driver (`cuMemHostRegister`, device-mapped). Where the
//! kernels read and write it depends on the GPU:
//!
//! - **In place** (unified memory: Jetson Thor, the default there): the kernels use the
//!   registered host pages directly. Zero copies; the cache-service sees every write.
//! - **Device** (a discrete GPU: H100/H200, the default there): the space is mirrored in
//!   device memory and the host pages are its tier. A page is copied to the device before the
//!   first pass that uses it (it may hold KV an earlier engine left in the arena), pages the
//!   GPU wrote are marked dirty, and dirty pages are copied back before the engine commits them
//!   to the cache ([`PageSpaces::flush`]), so the arena holds them for other sequences and for
//!   the next engine. One engine writes an arena's pages (the cache-service hands each page to
//!   one sequence at a time); several engines on one arena would need more than this.
//!
//! `EDGE_CUDA_KV=in-place|device` overrides the choice. The backend's private pages (KV that
//! lives only in the model, e.g. an MTP head's) are device memory in both.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, result, sys};
use engine_ops::kv::{HostPages, PageId};

use crate::CudaError;
use crate::device::GpuDevice;
use crate::space::SpaceTable;

/// The space id of private pages (as on the CPU).
pub const PRIVATE_SPACE: u32 = u32::MAX;

/// The environment variable that chooses where KV pages live on the GPU.
pub const KV_RESIDENCY_VAR: &str = "EDGE_CUDA_KV";

/// Where the kernels find a space's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    InPlace,
    Device,
}

impl Residency {
    /// `EDGE_CUDA_KV`, else in place on unified memory and on the device otherwise.
    pub fn for_device(integrated: bool) -> Result<Residency, CudaError> {
        match std::env::var(KV_RESIDENCY_VAR).as_deref() {
            Ok("in-place") => Ok(Residency::InPlace),
            Ok("device") => Ok(Residency::Device),
            Ok(other) => Err(CudaError::Driver(format!("{KV_RESIDENCY_VAR}={other}: in-place or device"))),
            Err(_) => Ok(if integrated { Residency::InPlace } else { Residency::Device }),
        }
    }
}

struct Space {
    memory: Arc<dyn HostPages>,
    /// The registered host memory's device-mapped address.
    host: u64,
    /// The device mirror (Device residency).
    mirror: Option<CudaSlice<u8>>,
    stride: usize,
    /// Per page: the mirror holds the page's current bytes.
    on_device: Vec<bool>,
    /// Per page: the mirror is newer than the host copy.
    dirty: Vec<bool>,
}

pub struct PageSpaces {
    dev: Arc<GpuDevice>,
    residency: Residency,
    table: SpaceTable,
    spaces: HashMap<u32, Space>,
    private: Vec<Option<CudaSlice<u8>>>,
    free_private: Vec<u32>,
}

fn driver(e: result::DriverError) -> CudaError {
    CudaError::Driver(format!("{e:?}"))
}

impl PageSpaces {
    pub fn new(dev: Arc<GpuDevice>) -> Result<PageSpaces, CudaError> {
        let residency = Residency::for_device(dev.info.integrated)?;
        tracing::info!(residency = ?residency, "KV pages on the GPU");
        Ok(PageSpaces {
            dev,
            residency,
            table: SpaceTable::default(),
            spaces: HashMap::new(),
            private: Vec::new(),
            free_private: Vec::new(),
        })
    }

    pub fn residency(&self) -> Residency {
        self.residency
    }

    /// Registers `memory` with the driver and maps `space` (mirrored on the device when the
    /// residency says so; in place when the mirror cannot be allocated).
    pub fn map(&mut self, space: u32, memory: Arc<dyn HostPages>) -> Result<(), CudaError> {
        self.unmap(space);
        let (stride, count) = (memory.stride_bytes(), memory.page_count());
        let bytes = stride * count;
        if bytes == 0 {
            self.table.insert(space, 0, stride, 0);
            return Ok(());
        }
        self.dev.context().bind_to_thread().map_err(driver)?;
        let host_ptr = memory.base().as_ptr().cast::<std::ffi::c_void>();
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        let mut host = 0u64;
        // SAFETY: `host_ptr..host_ptr + bytes` is mapped for as long as `memory` lives, and we
        // hold `memory` until the range is unregistered (unmap, drop).
        unsafe {
            sys::cuMemHostRegister_v2(host_ptr, bytes, flags).result().map_err(driver)?;
            if let Err(e) = sys::cuMemHostGetDevicePointer_v2(&mut host, host_ptr, 0).result() {
                let _ = sys::cuMemHostUnregister(host_ptr);
                return Err(driver(e));
            }
        }
        let mirror = match self.residency {
            Residency::InPlace => None,
            Residency::Device => match self.dev.stream().alloc_zeros::<u8>(bytes) {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!(space, bytes, error = ?e, "no device memory for the page space: its pages stay in host memory");
                    None
                }
            },
        };
        let base = mirror.as_ref().map_or(host, |m| m.device_ptr(self.dev.stream()).0);
        self.table.insert(space, base, stride, count);
        let (on_device, dirty) = (vec![false; count], vec![false; count]);
        tracing::info!(space, bytes, mirrored = mirror.is_some(), "page space mapped on the GPU");
        self.spaces.insert(space, Space { memory, host, mirror, stride, on_device, dirty });
        Ok(())
    }

    pub fn unmap(&mut self, space: u32) {
        self.table.remove(space);
        if let Some(s) = self.spaces.remove(&space) {
            // The space is going away (its session died): nothing is copied back.
            let _ = self.dev.stream().synchronize();
            let _ = self.dev.context().bind_to_thread();
            // SAFETY: the range was registered by `map` and no queued work uses it any more.
            unsafe {
                let _ = sys::cuMemHostUnregister(s.memory.base().as_ptr().cast());
            }
            drop(s.mirror);
        }
    }

    /// The device address of each page.
    pub fn addresses(&self, ids: &[PageId]) -> Result<Vec<u64>, CudaError> {
        ids.iter()
            .map(|id| {
                if id.space == PRIVATE_SPACE {
                    return self
                        .private
                        .get(id.index as usize)
                        .and_then(Option::as_ref)
                        .map(|p| p.device_ptr(self.dev.stream()).0)
                        .ok_or_else(|| CudaError::UnmappedPage(format!("{id:?}")));
                }
                self.table.address(*id).ok_or_else(|| CudaError::UnmappedPage(format!("{id:?}")))
            })
            .collect()
    }

    /// Makes the device copy of every mirrored page of `ids` current (copies in the pages
    /// not there yet); fails on an unmapped page.
    pub fn prepare(&mut self, ids: &[PageId]) -> Result<(), CudaError> {
        self.addresses(ids)?;
        let stream = self.dev.stream().clone();
        for id in ids {
            let Some(s) = self.spaces.get_mut(&id.space) else { continue };
            let Some(mirror) = &s.mirror else { continue };
            let i = id.index as usize;
            if s.on_device[i] {
                continue;
            }
            let off = (i * s.stride) as u64;
            let dst = mirror.device_ptr(&stream).0 + off;
            self.dev.context().bind_to_thread().map_err(driver)?;
            // SAFETY: both ranges are one page (`stride` bytes) of mapped, registered memory;
            // unified addressing tells the copy's direction from the addresses.
            unsafe { sys::cuMemcpyAsync(dst, s.host + off, s.stride, stream.cu_stream()) }.result().map_err(driver)?;
            s.on_device[i] = true;
        }
        Ok(())
    }

    /// Notes that the GPU wrote these pages (their mirror is newer than the host copy).
    pub fn written(&mut self, ids: &[PageId]) {
        for id in ids {
            if let Some(s) = self.spaces.get_mut(&id.space)
                && s.mirror.is_some()
                && let Some(d) = s.dirty.get_mut(id.index as usize)
            {
                *d = true;
                s.on_device[id.index as usize] = true;
            }
        }
    }

    /// Copies the dirty pages of `ids` back to their host memory and waits for the copies:
    /// after it, the host pages hold what the GPU wrote.
    pub fn flush(&mut self, ids: &[PageId]) -> Result<(), CudaError> {
        let stream = self.dev.stream().clone();
        let mut copied = false;
        for id in ids {
            let Some(s) = self.spaces.get_mut(&id.space) else { continue };
            let Some(mirror) = &s.mirror else { continue };
            let i = id.index as usize;
            if !s.dirty.get(i).copied().unwrap_or(false) {
                continue;
            }
            let off = (i * s.stride) as u64;
            let src = mirror.device_ptr(&stream).0 + off;
            self.dev.context().bind_to_thread().map_err(driver)?;
            // SAFETY: both ranges are one page of mapped, registered memory.
            unsafe { sys::cuMemcpyAsync(s.host + off, src, s.stride, stream.cu_stream()) }.result().map_err(driver)?;
            s.dirty[i] = false;
            copied = true;
        }
        if copied {
            stream.synchronize().map_err(driver)?;
        }
        Ok(())
    }

    /// `n` zeroed device pages of `page_bytes`.
    pub fn private_pages(&mut self, page_bytes: usize, n: usize) -> Result<Vec<PageId>, CudaError> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let page = self.dev.stream().alloc_zeros::<u8>(page_bytes).map_err(driver)?;
            let index = match self.free_private.pop() {
                Some(i) => {
                    self.private[i as usize] = Some(page);
                    i
                }
                None => {
                    self.private.push(Some(page));
                    (self.private.len() - 1) as u32
                }
            };
            out.push(PageId::new(PRIVATE_SPACE, index));
        }
        Ok(out)
    }

    pub fn zero_private_pages(&self, page_bytes: usize, pages: &[PageId]) -> Result<(), CudaError> {
        self.dev.context().bind_to_thread().map_err(driver)?;
        for addr in self.addresses(pages)? {
            // SAFETY: a private page of `page_bytes` bytes.
            unsafe { result::memset_d8_async(addr, 0, page_bytes, self.dev.stream().cu_stream()) }.map_err(driver)?;
        }
        Ok(())
    }

    pub fn free_private_pages(&mut self, pages: &[PageId]) {
        for id in pages.iter().filter(|id| id.space == PRIVATE_SPACE) {
            if let Some(slot) = self.private.get_mut(id.index as usize)
                && slot.take().is_some()
            {
                self.free_private.push(id.index);
            }
        }
    }
}

impl Drop for PageSpaces {
    fn drop(&mut self) {
        let spaces: Vec<u32> = self.spaces.keys().copied().collect();
        for s in spaces {
            self.unmap(s);
        }
    }
}
