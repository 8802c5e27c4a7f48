//! Person events, written straight into Arrow column builders.
//!
//! A person gets the next dense id, a name from the standard first/last name
//! lists, a random e-mail (`<3-6 chars>@<3-4 chars>.com`), a 16-digit credit
//! card number in four groups, a US city and state from the standard lists,
//! and `extra` padding so that the byte size averages `avg_person_byte_size`
//! (counting 8 bytes for the id plus the string lengths, as the standard does).

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringBuilder, TimestampMillisecondArray};
use arrow::record_batch::RecordBatch;

use crate::config::{FIRST_PERSON_ID, last_base0_person_id};
use crate::model::Model;
use crate::rng::EventRng;
use crate::schema::{Table, make_batch};
use crate::text::{FIRST_NAMES, LAST_NAMES, US_CITIES, US_STATES, extra_len, push_random_string};

/// Column builders of one `person` batch.
pub(crate) struct PersonColumns {
    id: Vec<i64>,
    name: StringBuilder,
    email: StringBuilder,
    credit_card: StringBuilder,
    city: StringBuilder,
    state: StringBuilder,
    date_time: Vec<i64>,
    extra: StringBuilder,
}

impl PersonColumns {
    /// Builders sized for `rows` persons.
    pub(crate) fn with_capacity(rows: usize, avg_size: usize) -> Self {
        PersonColumns {
            id: Vec::with_capacity(rows),
            name: StringBuilder::with_capacity(rows, rows * 12),
            email: StringBuilder::with_capacity(rows, rows * 14),
            credit_card: StringBuilder::with_capacity(rows, rows * 19),
            city: StringBuilder::with_capacity(rows, rows * 8),
            state: StringBuilder::with_capacity(rows, rows * 2),
            date_time: Vec::with_capacity(rows),
            extra: StringBuilder::with_capacity(rows, rows * avg_size),
        }
    }

    /// Appends the person created by event `event_number` at `timestamp_ms`.
    pub(crate) fn append(&mut self, model: &Model, event_number: u64, timestamp_ms: i64, scratch: &mut String) {
        let mut rng = model.rng(event_number);
        let rng = &mut rng;
        self.id.push(last_base0_person_id(event_number) as i64 + FIRST_PERSON_ID);
        let mut size = 8;

        scratch.clear();
        scratch.push_str(FIRST_NAMES[rng.index(FIRST_NAMES.len())]);
        scratch.push(' ');
        scratch.push_str(LAST_NAMES[rng.index(LAST_NAMES.len())]);
        size += scratch.len();
        self.name.append_value(scratch.as_str());

        scratch.clear();
        push_random_string(rng, 7, ' ', true, scratch);
        scratch.push('@');
        push_random_string(rng, 5, ' ', true, scratch);
        scratch.push_str(".com");
        size += scratch.len();
        self.email.append_value(scratch.as_str());

        scratch.clear();
        push_credit_card(rng, scratch);
        size += scratch.len();
        self.credit_card.append_value(scratch.as_str());

        let city = US_CITIES[rng.index(US_CITIES.len())];
        let state = US_STATES[rng.index(US_STATES.len())];
        size += city.len() + state.len();
        self.city.append_value(city);
        self.state.append_value(state);
        self.date_time.push(timestamp_ms);

        let len = extra_len(rng, size, model.avg_person);
        self.extra.append_value(model.text.extra(rng, len));
    }

    /// The finished batch.
    pub(crate) fn finish(mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(self.id)),
            Arc::new(self.name.finish()),
            Arc::new(self.email.finish()),
            Arc::new(self.credit_card.finish()),
            Arc::new(self.city.finish()),
            Arc::new(self.state.finish()),
            Arc::new(TimestampMillisecondArray::from(self.date_time)),
            Arc::new(self.extra.finish()),
        ];
        make_batch(Table::Person, columns)
    }
}

/// Four space-separated groups of four random decimal digits.
fn push_credit_card(rng: &mut EventRng, out: &mut String) {
    for group in 0..4 {
        if group > 0 {
            out.push(' ');
        }
        let v = rng.below(10_000) as u32;
        for div in [1000, 100, 10, 1] {
            out.push(char::from(b'0' + ((v / div) % 10) as u8));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_cards_have_four_groups_of_four_digits() {
        let mut rng = EventRng::from_seed(4);
        for _ in 0..100 {
            let mut s = String::new();
            push_credit_card(&mut rng, &mut s);
            let groups: Vec<&str> = s.split(' ').collect();
            assert_eq!(groups.len(), 4);
            assert!(groups.iter().all(|g| g.len() == 4 && g.bytes().all(|b| b.is_ascii_digit())));
        }
    }
}
