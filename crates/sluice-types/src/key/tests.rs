//! Golden vectors: a change to the key encoding or the key hash (a dependency upgrade, a
//! refactor) fails here, because state blobs and placement depend on both.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array, Int8Array, Int32Array,
    Int64Array, LargeStringArray, StringArray, StringViewArray, TimestampMillisecondArray, UInt16Array,
};
use arrow::datatypes::DataType;

use super::*;

fn encode(columns: Vec<ArrayRef>) -> KeyRows {
    let types = columns.iter().map(|c| c.data_type().clone()).collect();
    let encoder = KeyEncoder::new(types).expect("key types");
    let mut rows = KeyRows::default();
    encoder.encode(&columns, &mut rows).expect("encode");
    rows
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_key_hash_is_xxh3_64_with_seed_0() {
    // Published XXH3-64 test vectors (seed 0).
    assert_eq!(hash(b""), 0x2d06_8005_38d3_94c2);
    assert_eq!(hash(b"a"), 0xe6c6_32b6_1e96_4e1f);
    assert_eq!(hash(b"abc"), 0x78af_5f94_892f_3950);
}

#[test]
fn golden_encodings_and_hashes() {
    let rows = encode(vec![Arc::new(Int64Array::from(vec![Some(42), None, Some(-1)]))]);
    assert_eq!(hex(rows.row(0)), "022a00000000000000");
    assert_eq!(hex(rows.row(1)), "00");
    assert_eq!(hex(rows.row(2)), "02ffffffffffffffff");
    assert_eq!(rows.hash(0), hash(rows.row(0)));
    // Values checked against an independent XXH3 implementation (Python's xxhash).
    assert_eq!(rows.hash(0), 0xa21e_1a86_7f97_0bec, "hash of BIGINT 42");
    let rows = encode(vec![
        Arc::new(StringArray::from(vec![Some("ab")])),
        Arc::new(BooleanArray::from(vec![Some(true)])),
        Arc::new(Float64Array::from(vec![Some(-0.0)])),
        Arc::new(Decimal128Array::from(vec![Some(-5)]).with_precision_and_scale(10, 2).expect("decimal")),
    ]);
    assert_eq!(
        hex(rows.row(0)),
        concat!("06020000006162", "0101", "040000000000000000", "05fbffffffffffffffffffffffffffffff"),
    );
    assert_eq!(rows.hash(0), 0x5de2_f69e_ec3c_4749, "hash of ('ab', TRUE, -0.0, -0.05)");
}

#[test]
fn equal_sql_values_encode_alike_across_layouts_and_widths() {
    let narrow = encode(vec![Arc::new(Int8Array::from(vec![7]))]);
    let wide = encode(vec![Arc::new(Int64Array::from(vec![7]))]);
    assert_eq!(narrow.row(0), wide.row(0));
    let utf8 = encode(vec![Arc::new(StringArray::from(vec!["x"]))]);
    let large = encode(vec![Arc::new(LargeStringArray::from(vec!["x"]))]);
    let view = encode(vec![Arc::new(StringViewArray::from(vec!["x"]))]);
    assert_eq!(utf8.row(0), large.row(0));
    assert_eq!(utf8.row(0), view.row(0));
    let nans = encode(vec![Arc::new(Float64Array::from(vec![f64::NAN, -f64::NAN, 0.0, -0.0]))]);
    assert_eq!(nans.row(0), nans.row(1));
    assert_eq!(nans.row(2), nans.row(3));
}

#[test]
fn keys_decode_back_to_their_columns() {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from(vec![Some(1), None, Some(i32::MIN)])),
        Arc::new(UInt16Array::from(vec![Some(65535), Some(0), None])),
        Arc::new(Float32Array::from(vec![Some(1.5), None, Some(-2.25)])),
        Arc::new(StringArray::from(vec![Some(""), Some("héllo"), None])),
        Arc::new(TimestampMillisecondArray::from(vec![Some(-1), Some(i64::MAX), None])),
        Arc::new(Date32Array::from(vec![Some(19_000), None, Some(-3)])),
        Arc::new(BooleanArray::from(vec![None, Some(false), Some(true)])),
        Arc::new(Decimal128Array::from(vec![Some(12345), None, Some(-1)]).with_precision_and_scale(20, 3).expect("d")),
    ];
    let rows = encode(columns.clone());
    let types: Vec<DataType> = columns.iter().map(|c| c.data_type().clone()).collect();
    let decoded = KeyEncoder::new(types).expect("types").decode((0..rows.len()).map(|i| rows.row(i))).expect("decode");
    for (got, want) in decoded.iter().zip(&columns) {
        assert_eq!(got.as_ref(), want.as_ref());
    }
}

#[test]
fn damaged_keys_and_unsupported_types_are_refused() {
    let encoder = KeyEncoder::new(vec![DataType::Int64]).expect("types");
    for bad in [&[0x02, 1, 2][..], &[0x06, 0, 0, 0, 0], &[0x02, 0, 0, 0, 0, 0, 0, 0, 0, 9], &[0x09]] {
        let error = encoder.decode(std::iter::once(bad)).expect_err("damaged");
        assert_eq!(error.code, "key.damaged", "{bad:?}");
    }
    let error =
        KeyEncoder::new(vec![DataType::List(Arc::new(arrow::datatypes::Field::new("x", DataType::Int64, true)))])
            .expect_err("lists are not keys");
    assert_eq!(error.code, "key.type");
}

#[test]
fn the_fixed_width_path_writes_what_the_general_path_writes() {
    // Without NULLs integer keys take the fixed path; one NULL anywhere takes the other.
    let a: ArrayRef = Arc::new(Int64Array::from(vec![1, -2, i64::MAX, 0]));
    let b: ArrayRef = Arc::new(Int32Array::from(vec![7, 8, i32::MIN, 9]));
    let fast = encode(vec![Arc::clone(&a), Arc::clone(&b)]);
    let b_with_null: ArrayRef = Arc::new(Int32Array::from(vec![Some(7), Some(8), Some(i32::MIN), None]));
    let general = encode(vec![a, b_with_null]);
    for row in 0..3 {
        assert_eq!(fast.row(row), general.row(row), "row {row}");
        assert_eq!(fast.hash(row), general.hash(row), "row {row}");
    }
    assert_eq!(hex(general.row(3)), "02000000000000000000", "BIGINT 0, then NULL");
    assert_eq!(fast.len(), 4);
}
