use super::*;

#[test]
fn samples_comments_and_blank_lines() {
    let page = parse(
        "# HELP up Whether it is up.\n\
         # TYPE up gauge\n\
         \n\
         # any other comment\n\
         up 1\n\
         up{job=\"a\"} 0 1700000000000\n\
         # EOF\n",
    )
    .unwrap();
    assert_eq!(page.samples.len(), 2);
    assert_eq!(page.samples[0].labels, Vec::new());
    assert_eq!(page.samples[0].timestamp, None);
    assert_eq!(page.samples[1].timestamp, Some(1_700_000_000_000));
    assert_eq!(page.kind("up"), Some("gauge"));
    assert_eq!(page.help("up"), Some("Whether it is up."));
    assert_eq!(page.sum("up"), 1.0);
    assert_eq!(page.value("up", &[("job", "a")]), Some(0.0));
    assert_eq!(page.value("down", &[]), None);
    assert!(!page.has("up_total"), "names are matched exactly");
}

#[test]
fn escaped_label_values_are_unescaped() {
    let page = parse(
        "m{model=\"a\\\"b\\\\c\\nd\",x=\"}{,=\"} 1\n\
         # HELP m Back\\\\slash and\\nnewline.\n",
    )
    .unwrap();
    let s = &page.samples[0];
    assert_eq!(s.label("model"), Some("a\"b\\c\nd"));
    assert_eq!(s.label("x"), Some("}{,="));
    assert_eq!(page.help("m"), Some("Back\\slash and\nnewline."));
}

#[test]
fn histograms_read_cumulative_buckets_with_inf() {
    let page = parse(
        "# TYPE h histogram\n\
         h_bucket{a=\"b\",le=\"0.1\"} 1\n\
         h_bucket{a=\"b\",le=\"1\"} 2\n\
         h_bucket{a=\"b\",le=\"+Inf\"} 3\n\
         h_sum{a=\"b\"} 2.5\n\
         h_count{a=\"b\"} 3\n\
         h_count{a=\"c\"} 0\n",
    )
    .unwrap();
    let h = page.histogram("h", &[("a", "b")]).unwrap();
    assert_eq!(
        h.buckets,
        vec![(0.1, 1.0), (1.0, 2.0), (f64::INFINITY, 3.0)]
    );
    assert_eq!(h.sum, 2.5);
    assert_eq!(h.count, 3.0);
    assert_eq!(page.sum("h_count"), 3.0);
    assert_eq!(page.histogram("h", &[("a", "z")]), None);
}

#[test]
fn special_values_and_float_forms() {
    let page = parse("a +Inf\nb -Inf\nc NaN\nd 1e3\ne -0.5\nf 96.0\nvllm:x_total 2\n").unwrap();
    let v: Vec<f64> = page.samples.iter().map(|s| s.value).collect();
    assert_eq!(v[0], f64::INFINITY);
    assert_eq!(v[1], f64::NEG_INFINITY);
    assert!(v[2].is_nan());
    assert_eq!(&v[3..], &[1000.0, -0.5, 96.0, 2.0]);
}

#[test]
#[should_panic(expected = "several m samples")]
fn value_of_an_ambiguous_series_panics() {
    let page = parse("m{a=\"1\"} 1\nm{a=\"2\"} 2\n").unwrap();
    assert_eq!(page.sum_where("m", &[("a", "2")]), 2.0);
    page.value("m", &[]);
}

#[test]
fn malformed_lines_are_errors_with_their_number() {
    for (text, wanted) in [
        ("ok 1\nm{a=\"1\" 1\n", "expected ','"),
        ("m{a=1} 1", "not quoted"),
        ("m{a=\"1} 1", "open"),
        ("m{1a=\"x\"} 1", "bad label name"),
        ("m one", "bad value"),
        ("m", "no value"),
        ("m 1 2 3", "unexpected"),
        ("m 1 later", "bad timestamp"),
        ("9m 1", "bad metric name"),
        ("m{a=\"\\t\"} 1", "bad escape"),
    ] {
        let e = parse(text).unwrap_err();
        assert!(e.message.contains(wanted), "{text:?}: {e}");
        assert_eq!(e.line, text.lines().count(), "{text:?}: {e}");
    }
}
