//! Tensors: immutable, reference-counted views of device storage.
//!
//! Every op runs on the calling thread's current stream of the tensor's device and returns
//! as soon as the work is queued; reading values back (`to_vec`) waits for it. Inputs
//! written on other streams are waited for automatically (see [`crate::storage`]).

mod families;
mod fused;
mod ops;

pub use crate::shape::{broadcast_shapes, contiguous_strides, Dims, Layout};
pub(crate) use crate::shape::{checked_byte_size, checked_elem_count};

use std::fmt;

use rand::SeedableRng;
use rand_distr::{Distribution, Normal, Uniform};

use crate::backend::DevicePtr;
use crate::dtype::{as_bytes, as_bytes_mut};
use crate::kernel::{Cast, Fill, Kernel};
use crate::storage::Storage;
use crate::sync::Arc;
use crate::{DType, Device, Element, Error, Result, Stream};

/// An n-dimensional array on a device. Cloning is cheap (shares storage). Tensors are
/// `Send + Sync`: make one on a thread, use it on any other.
///
/// ```
/// use streampool::{Device, Tensor};
/// let dev = Device::cpu();
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2], &dev).unwrap();
/// let b = a.matmul(&a).unwrap();
/// assert_eq!(b.to_vec::<f32>().unwrap(), vec![7.0, 10.0, 15.0, 22.0]);
/// ```
#[derive(Clone)]
pub struct Tensor(Arc<TensorInner>);

/// A tensor's one heap allocation: its layout, and its storage or the tensor that owns it.
struct TensorInner {
    storage: StorageRef,
    layout: Layout,
    dtype: DType,
}

/// Where a tensor's storage is. An op's output owns its storage inline (one allocation per
/// op, not two); a view holds the owning tensor, which keeps the storage alive exactly as
/// long as an `Arc<Storage>` shared by all of them would.
enum StorageRef {
    Owned(Storage),
    /// The tensor that owns the storage (always `Owned`: a view of a view holds the owner).
    Viewed(Arc<TensorInner>),
}

impl TensorInner {
    fn storage(&self) -> &Storage {
        match &self.storage {
            StorageRef::Owned(s) => s,
            StorageRef::Viewed(owner) => match &owner.storage {
                StorageRef::Owned(s) => s,
                // Invariant: `Tensor::view` only ever points at an owner.
                StorageRef::Viewed(_) => unreachable!("a view's owner is never a view"),
            },
        }
    }
}

/// An op's inputs: a few tensors, on the stack.
pub(crate) type Inputs<'a> = smallvec::SmallVec<[&'a Tensor; 4]>;

/// The one output an op produces (every op has one).
pub(crate) struct OutSpec {
    pub shape: Dims,
    pub dtype: DType,
}

impl OutSpec {
    pub(crate) fn f32(shape: &[usize]) -> Self {
        Self {
            shape: Dims::from_slice(shape),
            dtype: DType::F32,
        }
    }
}

/// Queues one kernel on `device`'s current stream: waits for the inputs' writers, allocates
/// the output, launches, and wraps the output as a tensor. `build` gets the output pointer.
pub(crate) fn launch(
    device: &Device,
    inputs: &[&Tensor],
    out: OutSpec,
    build: impl FnOnce(DevicePtr) -> Kernel,
) -> Result<Tensor> {
    crate::stream_pool::with_current_stream(device, |stream| launch_on(stream, inputs, out, build))
}

/// [`launch`] on `stream`. Allocates nothing on the heap but the output tensor (one
/// allocation: its layout and storage) for outputs of rank <= 4; the CPU and CUDA launches
/// allocate nothing either (under eager events, the write event is one more).
pub(crate) fn launch_on(
    stream: &Stream,
    inputs: &[&Tensor],
    out: OutSpec,
    build: impl FnOnce(DevicePtr) -> Kernel,
) -> Result<Tensor> {
    let device = stream.device();
    for t in inputs {
        t.storage().prepare_use(stream)?;
    }
    crate::graph::note_inputs(device, inputs);
    let bytes = checked_byte_size("alloc", &out.shape, out.dtype.size())?;
    // From the caching allocator, or from a graph's pool while this thread captures one.
    let (block, pooled) = crate::graph::alloc(device, bytes, stream)?;
    let kernel = build(block.ptr);
    // SAFETY: input pointers are alive (we hold the tensors, and the allocator will not reuse
    // their blocks until this stream passes the guard recorded when they are freed); the
    // output is a fresh block of the right size; cross-stream writers were waited for above.
    let launched = unsafe { stream.inner.launch(kernel) };
    // A failed record is reported after the storage exists (dropping it returns the block);
    // without the event, another stream's first use records one (as under lazy events).
    let (event, unrecorded) = match launched.is_ok() && device.eager_events() {
        true => match stream.inner.record(false) {
            Ok(e) => (Some(e), None),
            Err(e) => (None, Some(e)),
        },
        false => (None, None),
    };
    // Made even when the launch failed, so that dropping it returns the block.
    let storage = Storage::new(device.clone(), block, stream, event);
    let storage = if pooled {
        storage.graph_owned()
    } else {
        storage
    };
    let tensor = Tensor::from_storage(storage, out.shape, out.dtype);
    launched?;
    match unrecorded {
        Some(e) => Err(e),
        None => Ok(tensor),
    }
}

impl Tensor {
    pub(crate) fn from_storage(storage: Storage, shape: Dims, dtype: DType) -> Tensor {
        Tensor(Arc::new(TensorInner {
            storage: StorageRef::Owned(storage),
            layout: Layout::contiguous_owned(shape),
            dtype,
        }))
    }

    pub(crate) fn storage(&self) -> &Storage {
        self.0.storage()
    }

    /// A view sharing this tensor's storage with another layout.
    pub(crate) fn view(&self, layout: Layout) -> Tensor {
        let owner = match &self.0.storage {
            StorageRef::Owned(_) => self.0.clone(),
            StorageRef::Viewed(owner) => owner.clone(),
        };
        Tensor(Arc::new(TensorInner {
            storage: StorageRef::Viewed(owner),
            layout,
            dtype: self.0.dtype,
        }))
    }

    /// Copies `data` (row-major, `shape`) to `device`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
        Self::from_slice(&data, shape, device)
    }

    /// Copies `data` (row-major, `shape`) to `device`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        let n = checked_elem_count("from_vec", shape)?;
        if n != data.len() {
            return Err(Error::shape(
                "from_vec",
                format!("{} elements do not fill shape {shape:?}", data.len()),
            ));
        }
        let storage = crate::stream_pool::with_current_stream(device, |stream| {
            let bytes = as_bytes(data).to_vec();
            let block =
                device
                    .allocator()
                    .alloc(bytes.len(), stream.index(), stream.inner.as_ref())?;
            let ptr = block.ptr;
            // The storage owns the block before the copy is queued, so an error frees it.
            let storage = Storage::new(device.clone(), block, stream, None);
            // SAFETY: the block holds at least `bytes.len()` bytes and stays allocated (the
            // storage is alive, and once freed its guard covers this copy).
            unsafe { stream.inner.copy_from_host(bytes, ptr)? };
            Ok(if device.eager_events() {
                let block_event = stream.inner.record(false)?;
                storage.with_write_event(block_event)
            } else {
                storage
            })
        })?;
        Ok(Tensor::from_storage(
            storage,
            Dims::from_slice(shape),
            T::DTYPE,
        ))
    }

    /// An `f32` tensor filled with `value`.
    pub fn full(value: f32, shape: &[usize], device: &Device) -> Result<Tensor> {
        let len = checked_elem_count("full", shape)?;
        launch(device, &[], OutSpec::f32(shape), |o| {
            Kernel::Fill(Fill {
                out: o,
                len,
                value,
                dtype: DType::F32,
            })
        })
    }

    /// An `f32` tensor of zeros.
    pub fn zeros(shape: &[usize], device: &Device) -> Result<Tensor> {
        Self::full(0.0, shape, device)
    }

    /// An `f32` tensor of ones.
    pub fn ones(shape: &[usize], device: &Device) -> Result<Tensor> {
        Self::full(1.0, shape, device)
    }

    /// Standard-normal `f32` values from a seeded generator (same seed, same values, on every
    /// backend).
    pub fn randn(shape: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let normal = Normal::new(0.0f32, 1.0).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let data = host_filled("randn", shape, device, || normal.sample(&mut rng))?;
        Self::from_vec(data, shape, device)
    }

    /// Uniform `f32` values in `[lo, hi)` from a seeded generator.
    pub fn rand_uniform(
        shape: &[usize],
        lo: f32,
        hi: f32,
        seed: u64,
        device: &Device,
    ) -> Result<Tensor> {
        if lo.is_nan() || hi.is_nan() || lo >= hi {
            return Err(Error::InvalidArgument(format!(
                "rand_uniform: empty range [{lo}, {hi})"
            )));
        }
        // `Uniform::new` panics unless the width is a finite f32.
        if !(hi - lo).is_finite() {
            return Err(Error::InvalidArgument(format!(
                "rand_uniform: range [{lo}, {hi}) is not finite"
            )));
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let dist = Uniform::new(lo, hi);
        let data = host_filled("rand_uniform", shape, device, || dist.sample(&mut rng))?;
        Self::from_vec(data, shape, device)
    }

    /// Copies the elements (row-major) to the host, waiting for the work that produces them.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DType {
                op: "to_vec",
                expected: self.dtype(),
                got: T::DTYPE,
            });
        }
        let t = self.as_contiguous()?;
        crate::stream_pool::with_current_stream(t.device(), |stream| {
            t.storage().prepare_use(stream)?;
            let mut out = vec![T::zeros_like(); t.elem_count()];
            let src = t.ptr();
            // SAFETY: the storage is alive (we hold `t`) and covers `elem_count` elements from
            // `ptr`.
            unsafe { stream.inner.copy_to_host(src, as_bytes_mut(&mut out))? };
            Ok(out)
        })
    }

    /// The single element of a one-element `f32` tensor.
    pub fn to_scalar(&self) -> Result<f32> {
        if self.elem_count() != 1 {
            return Err(Error::shape(
                "to_scalar",
                format!("tensor of shape {:?} is not a scalar", self.dims()),
            ));
        }
        Ok(self.to_vec::<f32>()?[0])
    }

    /// Copies this tensor to another device (through the host).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if self.device().same(device) {
            return Ok(self.clone());
        }
        match self.dtype() {
            DType::F32 => Tensor::from_vec(self.to_vec::<f32>()?, self.dims(), device),
            DType::F16 => Tensor::from_vec(self.to_vec::<half::f16>()?, self.dims(), device),
            DType::BF16 => Tensor::from_vec(self.to_vec::<half::bf16>()?, self.dims(), device),
            DType::I64 => Tensor::from_vec(self.to_vec::<i64>()?, self.dims(), device),
        }
    }

    /// This tensor converted to floating-point `dtype` (a clone if it already has it). Values
    /// round to nearest even; `F32` values beyond `F16`'s range become `inf`.
    ///
    /// ```
    /// use streampool::{DType, Device, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 0.1], &[2], &Device::cpu()).unwrap();
    /// let h = x.to_dtype(DType::F16).unwrap();
    /// assert_eq!(h.dtype(), DType::F16);
    /// let back = h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    /// assert_eq!(back, vec![1.0, half::f16::from_f32(0.1).to_f32()]);
    /// ```
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        self.expect_float("to_dtype")?;
        if !dtype.is_float() {
            return Err(Error::DType {
                op: "to_dtype",
                expected: DType::F32,
                got: dtype,
            });
        }
        let x = self.as_contiguous()?;
        let (ptr, len, from) = (x.ptr(), x.elem_count(), x.dtype());
        let spec = OutSpec {
            shape: Dims::from_slice(x.dims()),
            dtype,
        };
        launch(self.device(), &[&x], spec, |o| {
            Kernel::Cast(Cast {
                x: ptr,
                out: o,
                len,
                from,
                to: dtype,
            })
        })
    }

    /// The shape.
    pub fn dims(&self) -> &[usize] {
        &self.0.layout.shape
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.layout.shape.len()
    }

    /// The number of elements.
    pub fn elem_count(&self) -> usize {
        self.0.layout.elem_count()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// The device holding the data.
    pub fn device(&self) -> &Device {
        self.storage().device()
    }

    /// The layout (shape, strides, offset).
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    /// Whether the elements are contiguous and row-major.
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    /// The address of element zero.
    pub(crate) fn ptr(&self) -> DevicePtr {
        self.storage()
            .ptr()
            .offset(self.0.layout.offset * self.0.dtype.size())
    }

    /// Whether `self` and `other` share storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        std::ptr::eq(self.storage(), other.storage())
    }
}

/// `shape`'s elements drawn from `next`, in a host vector reserved up front so that a shape
/// too large for the host is an error rather than an allocation abort.
fn host_filled(
    op: &'static str,
    shape: &[usize],
    device: &Device,
    mut next: impl FnMut() -> f32,
) -> Result<Vec<f32>> {
    let bytes = checked_byte_size(op, shape, 4)?;
    let n = bytes / 4;
    let mut data = Vec::new();
    data.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        device: format!("host (staging for {})", device.name()),
        requested: bytes,
        allocated: 0,
        reserved: 0,
        limit: None,
    })?;
    data.extend((0..n).map(|_| next()));
    Ok(data)
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({:?}, {:?}, {})",
            self.dims(),
            self.dtype(),
            self.device().name()
        )
    }
}

/// A zero value of each element type (used to size host buffers).
pub(crate) trait ZerosLike {
    fn zeros_like() -> Self;
}
impl<T: Element> ZerosLike for T {
    fn zeros_like() -> Self {
        // SAFETY: `Element` types are numeric plain-old-data; all-zero bits is the value zero.
        unsafe { std::mem::zeroed() }
    }
}
