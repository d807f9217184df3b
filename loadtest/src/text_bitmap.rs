//! plotters' bitmap backend with text drawn from the public-domain 8×8 font in `font8x8`,
//! scaled by whole pixels to the requested size: PNG charts without any font file (plotters'
//! own text path needs system fonts, and panics without a font feature).

use plotters::prelude::*;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind, FontTransform};

/// plotters' bitmap backend with the built-in font.
pub struct TextBitmap<'a>(pub BitMapBackend<'a>);

fn glyph(c: char) -> [u8; 8] {
    let i = if c.is_ascii() && !c.is_ascii_control() { c as usize } else { '?' as usize };
    font8x8::legacy::BASIC_LEGACY[i]
}

/// Pixel scale of the 8×8 font for a plotters text size.
fn text_scale(size: f64) -> i32 {
    ((size / 14.0).round() as i32).max(1)
}

impl DrawingBackend for TextBitmap<'_> {
    type ErrorType = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.0.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        ul: BackendCoord,
        br: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_rect(ul, br, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<T: BackendTextStyle>(
        &self,
        text: &str,
        style: &T,
    ) -> Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        let s = text_scale(style.size()) as u32;
        Ok((8 * s * text.chars().count() as u32, 8 * s))
    }

    fn draw_text<T: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &T,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let s = text_scale(style.size());
        let width = 8 * s * text.chars().count() as i32;
        let height = 8 * s;
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Center => -width / 2,
            HPos::Right => -width,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let trans: FontTransform = style.transform();
        let (w, h) = self.get_size();
        for (ci, c) in text.chars().enumerate() {
            let rows = glyph(c);
            for (gy, row) in rows.iter().enumerate() {
                for gx in 0..8 {
                    // Bit 0 is the leftmost pixel of the row.
                    if row & (1 << gx) == 0 {
                        continue;
                    }
                    for sy in 0..s {
                        for sx in 0..s {
                            let x = dx + (ci as i32 * 8 + gx) * s + sx;
                            let y = dy + gy as i32 * s + sy;
                            let (x, y) = trans.transform(x, y);
                            let (x, y) = (pos.0 + x, pos.1 + y);
                            if x >= 0 && y >= 0 && (x as u32) < w && (y as u32) < h {
                                self.0.draw_pixel((x, y), color)?;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
