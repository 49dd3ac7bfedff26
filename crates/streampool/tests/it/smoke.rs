use streampool::{Device, Tensor};

#[test]
fn smoke() {
    let dev = Device::cpu();
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2], &dev).unwrap();
    let b = a.matmul(&a).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![7.0, 10.0, 15.0, 22.0]);
    let c = b.t().unwrap().contiguous().unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![7.0, 15.0, 10.0, 22.0]);
    let s = a
        .softmax()
        .unwrap()
        .sum(1, false)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!((s[0] - 1.0).abs() < 1e-6);
    let bias = Tensor::from_vec(vec![1.0f32, -10.0], &[2], &dev).unwrap();
    assert_eq!(
        a.add(&bias).unwrap().to_vec::<f32>().unwrap(),
        vec![2.0, -8.0, 4.0, -6.0]
    );
}
