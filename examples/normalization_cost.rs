//! What computing keys costs per claim, in one run: the bench's signup claims (a username, an
//! email, two routes, `tools/bench`'s `signup_claims` at the default batch of 4) and the same
//! values sent in capitals and fullwidth, under each normalization. docs/benchmarks.md,
//! "Normalization", divides it by `serve`'s CPU per pair.
//!
//! `cargo run --release --example normalization_cost [ENTITIES]`

use std::hint::black_box;
use std::time::Instant;

use topology_claims::domain::namespaces::KeyRules;
use topology_claims::domain::Normalization;

fn signup(entity: &str) -> [String; 4] {
    [
        entity.to_owned(),
        format!("{entity}@bench.example"),
        format!("org/{entity}"),
        format!("org/{entity}/r3"),
    ]
}

fn fullwidth(value: &str) -> String {
    value
        .chars()
        .map(|c| match c {
            '!'..='~' => char::from_u32(c as u32 - 0x21 + 0xFF01).unwrap_or(c),
            _ => c,
        })
        .collect()
}

/// A way a cell may send a value.
type Form = fn(&str) -> String;

fn main() {
    let entities: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(200_000);
    let forms: [(&str, Form); 3] = [
        ("as the bench sends them (lowercase ASCII)", |v| {
            v.to_owned()
        }),
        ("capitalized", |v| v.to_uppercase()),
        ("fullwidth", fullwidth),
    ];
    println!("{entities} signups of 4 claims each; ns per claim (min of 3 runs)");
    println!(
        "{:<44} {:>8} {:>24} {:>17}",
        "values", "exact", "ascii-case-insensitive", "precis-username"
    );
    for (name, form) in forms {
        let values: Vec<String> = (0..entities)
            .flat_map(|i| signup(&format!("u{i:07}-bench")))
            .map(|v| form(&v))
            .collect();
        let mut row = Vec::new();
        for normalization in Normalization::ALL {
            let rules = KeyRules {
                normalization,
                max_chars: 255,
                pattern: None,
            };
            let mut best = f64::MAX;
            for _ in 0..3 {
                let started = Instant::now();
                let mut bytes = 0usize;
                for value in &values {
                    // A refused value (a fullwidth `/` is outside PRECIS) costs what it costs.
                    bytes += rules.key_of(black_box(value)).map_or(0, |k| k.len());
                }
                black_box(bytes);
                let ns = started.elapsed().as_nanos() as f64 / values.len() as f64;
                best = best.min(ns);
            }
            row.push(best);
        }
        println!(
            "{:<44} {:>8.0} {:>24.0} {:>17.0}",
            name, row[0], row[1], row[2]
        );
    }
}
